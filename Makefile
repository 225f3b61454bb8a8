# capkernel — build, test, benchmark and demo. Needs only Go (see go.mod);
# OPA's CLI for the Rego tests is built from the module cache (go tool opa).
GO      ?= go
# jwx/v4 is built on encoding/json/v2, still behind an experiment in Go 1.26.
export GOEXPERIMENT := jsonv2
PKGS    := ./...
BENCH   ?= .
BENCHTIME ?= 2s

.PHONY: build test vet hygiene rego-test unit-test upstream-deps fuzz bench bench-report demo clean bwrap console console-deps console-check console-test chromium strace chaos browser-test mcp-ts-deps

build: console
	$(GO) build -o bin/kernelctl ./cmd/kernelctl

## test: go vet, repository hygiene, the race-enabled unit tests, the
## console's build check and browser tests, the Rego tests, short fuzz runs
test: bwrap strace vet hygiene console-check console-test upstream-deps mcp-ts-deps unit-test rego-test fuzz

## bwrap: proc.exec runs under bubblewrap; install it (Debian) when missing,
## with socat, which the sandbox tests use, so every sandbox test runs
bwrap:
	@command -v bwrap >/dev/null && command -v socat >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap socat >/dev/null; }
	@command -v bwrap >/dev/null || { echo "bubblewrap is required: apt-get install -y bubblewrap"; exit 1; }

## strace: the fault-injection suite (internal/chaos) runs kernelctl serve
## under strace -e inject=…; install it (Debian) when missing
strace:
	@command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace >/dev/null; }

## chaos: the long fault-injection campaign (EIO/ENOSPC on fdatasync,
## pwrite64, syncfs, renameat and write at varying points; make test runs
## a short one); prints the fault cases, acknowledged calls, lost /
## duplicated / contradicted counts and the exit and restart times
chaos: strace
	$(GO) test -count=1 -timeout 60m -v -run '^TestChaos$$' ./internal/chaos/ -args -chaos.long

## console: the web console's embedded assets (console/assets), built from
## console/web by esbuild; the built files are committed so that a plain
## `go build` embeds them, and console-check proves they match the sources
console: console-deps
	cd console/web && node build.mjs

## console-deps: Node.js and the console's pinned npm packages (package-lock.json)
console-deps:
	@command -v node >/dev/null && command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
	@cd console/web && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }

## console-check: the committed assets are exactly what the sources build to
console-check: console-deps
	@tmp=$$(mktemp -d) && cd console/web && node build.mjs $$tmp && diff -r $$tmp ../assets >/dev/null \
	  || { echo "console/assets do not match console/web: run make console and commit"; diff -r $$tmp ../assets | head -20; rm -rf $$tmp; exit 1; }; rm -rf $$tmp

## chromium: Debian's Chromium and ChromeDriver for the console's browser tests
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

## console-test: the browser verifier against the golden vectors (node --test);
## the browser tests themselves run in unit-test (console/browser_test.go),
## which CAPKERNEL_BROWSER_TESTS=1 makes fail instead of skip without Chromium
console-test: console-deps chromium
	cd console/web && node --test test/

export CAPKERNEL_BROWSER_TESTS := 1
# Test artifacts (the console's screenshots) go here, outside the tree.
export CAPKERNEL_TEST_ARTIFACTS ?= $(or $(TMPDIR),/tmp)/capkernel-test-artifacts

## browser-test: only the console's browser tests (Playwright driving
## Chromium, console/web/browser/console.mjs); screenshots in
## $(CAPKERNEL_TEST_ARTIFACTS)/console
browser-test: console-deps chromium
	$(GO) test -count=1 -run '^TestBrowser$$' -v ./console/

## mcp-ts-deps: the official MCP TypeScript SDK (pinned in
## mcpgateway/testdata/tsclient/package-lock.json), a second real client of
## kernelctl mcp beside the Go SDK; CAPKERNEL_MCP_TS_TESTS=1 makes its tests
## fail instead of skip when it is missing
mcp-ts-deps:
	@command -v node >/dev/null && command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
	@cd mcpgateway/testdata/tsclient && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }

export CAPKERNEL_MCP_TS_TESTS := 1

vet:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

## upstream-deps: the official MCP reference servers the upstream tests run
## as real upstreams (pinned in upstream/testdata/npm/package-lock.json)
upstream-deps:
	@command -v node >/dev/null && command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
	@cd upstream/testdata/npm && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --loglevel=error; }

export CAPKERNEL_NPM_TESTS := 1

unit-test:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

## hygiene: go.mod and go.sum are tidy (go mod tidy would change nothing), and
## no build output is tracked: no ELF binary, *.test, node_modules/ or bin/
hygiene:
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy; run go mod tidy:"; $(GO) mod tidy -diff; exit 1; }
	@bad=$$(git ls-files -z | xargs -0 -r sh -c 'for f; do \
		case "$$f" in *.test|bin/*|*/bin/*|node_modules/*|*/node_modules/*) echo "$$f"; continue;; esac; \
		[ -f "$$f" ] && [ "$$(head -c 4 "$$f" | od -An -tx1 | tr -d " ")" = 7f454c46 ] && echo "$$f"; \
	done' sh); test -z "$$bad" || { echo "build outputs are tracked (git rm --cached them):"; echo "$$bad"; exit 1; }

rego-test:
	$(GO) tool opa test -v --v1-compatible policy/rego

# Each fuzz target for a fixed number of executions (about 5–10 s each here),
# so CI exercises the targets' corpora and a short random search. Counts, not
# durations: a duration-based -fuzztime can fail with a spurious "context
# deadline exceeded" in Go 1.26's fuzz coordinator (golang/go#75804, fixed in
# Go 1.27). Run longer locally with FUZZTIME=5m (any -fuzztime value).
fuzz_one = $(GO) test -run='^$$' -fuzz='^$(1)$$' -fuzztime=$(or $(FUZZTIME),$(3)) -fuzzminimizetime=100x ./$(2)/
fuzz:
	$(call fuzz_one,FuzzCanonicalize,jcs,300000x)
	$(call fuzz_one,FuzzDecodeEnvelope,kernel,30000x)
	$(call fuzz_one,FuzzVerify,receipts,60000x)
	$(call fuzz_one,FuzzDecodeRecord,ledger,15000x)
	$(call fuzz_one,FuzzVerifyExport,ledger,4000x)
	$(call fuzz_one,FuzzVerifyInclusion,ledger,150000x)
	$(call fuzz_one,FuzzVerifyConsistency,ledger,80000x)
	$(call fuzz_one,FuzzCheckpointNote,ledger,100000x)
	$(call fuzz_one,FuzzQuick,syscalls,20000x)
	$(call fuzz_one,FuzzRoundTrip,internal/jsonpack,20000x)
	$(call fuzz_one,FuzzCanonicalCheck,internal/jsonpack,20000x)
	$(call fuzz_one,FuzzUnpackPayload,kernel,20000x)
	$(call fuzz_one,FuzzCheckpointPack,ledger,20000x)
	$(call fuzz_one,FuzzAppendResult,httpapi,20000x)

## bench: the Go benchmarks (Invoke against bare bbolt measured in the same
## run, policy, ledger, receipts, tokens, JCS, strict JSON against
## encoding/json, echo through the MCP gateway against the HTTP API);
## make bench-report for the side-by-side report over HTTP
bench: upstream-deps
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) ./kernel/ ./policy/ ./ledger/ ./receipts/ ./captoken/ ./jcs/ ./strictjson/ ./mcpgateway/

## bench-report: kernel over HTTP against OPA's own server, in-process Invoke,
## durable writes against bare bbolt, the ledger at 1M entries and proc.exec
## against bare bwrap, side by side in one run; writes docs/benchmarks.md and
## docs/benchmarks.svg (about 5 minutes)
bench-report: bwrap upstream-deps
	$(GO) run ./cmd/benchreport

## demo: a scripted agent session through the kernel on a temporary data dir
demo: bwrap
	$(GO) run ./cmd/kernelctl demo

clean:
	rm -rf bin
