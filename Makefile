# capkernel — build, test, benchmark and demo. Needs only Go (see go.mod);
# OPA's CLI for the Rego tests is built from the module cache (go tool opa).
GO      ?= go
# jwx/v4 is built on encoding/json/v2, still behind an experiment in Go 1.26.
export GOEXPERIMENT := jsonv2
PKGS    := ./...
BENCH   ?= .
BENCHTIME ?= 2s

.PHONY: build test vet rego-test unit-test fuzz bench bench-report demo clean bwrap

build:
	$(GO) build -o bin/kernelctl ./cmd/kernelctl

## test: go vet, the race-enabled unit tests, the Rego tests, short fuzz runs
test: bwrap vet unit-test rego-test fuzz

## bwrap: proc.exec runs under bubblewrap; install it (Debian) when missing,
## with socat, which the sandbox tests use, so every sandbox test runs
bwrap:
	@command -v bwrap >/dev/null && command -v socat >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap socat >/dev/null; }
	@command -v bwrap >/dev/null || { echo "bubblewrap is required: apt-get install -y bubblewrap"; exit 1; }

vet:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

unit-test:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

rego-test:
	$(GO) tool opa test -v --v1-compatible policy/rego

# Each fuzz target for a few seconds, so CI exercises the targets' corpora
# and a short random search; run longer locally with FUZZTIME=5m.
FUZZTIME ?= 10s
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzCanonicalize$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./jcs/
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeEnvelope$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./kernel/
	$(GO) test -run='^$$' -fuzz='^FuzzVerify$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./receipts/
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeRecord$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./ledger/
	$(GO) test -run='^$$' -fuzz='^FuzzVerifyExport$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./ledger/
	$(GO) test -run='^$$' -fuzz='^FuzzVerifyInclusion$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./ledger/
	$(GO) test -run='^$$' -fuzz='^FuzzVerifyConsistency$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./ledger/
	$(GO) test -run='^$$' -fuzz='^FuzzCheckpointNote$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s ./ledger/

## bench: the Go benchmarks (Invoke against bare bbolt measured in the same
## run, policy, ledger, receipts, tokens, JCS); make bench-report for the
## side-by-side report over HTTP
bench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) ./kernel/ ./policy/ ./ledger/ ./receipts/ ./captoken/ ./jcs/

## bench-report: kernel over HTTP against OPA's own server, in-process Invoke,
## durable writes against bare bbolt, the ledger at 1M entries and proc.exec
## against bare bwrap, side by side in one run; writes docs/benchmarks.md and
## docs/benchmarks.svg (about 5 minutes)
bench-report: bwrap
	$(GO) run ./cmd/benchreport

## demo: a scripted agent session through the kernel on a temporary data dir
demo: bwrap
	$(GO) run ./cmd/kernelctl demo

clean:
	rm -rf bin
