package capkernel

decision := {"autonomy_mode": "autopilot", "risk_score": 0, "risk_basis": ["test bundle"]}
