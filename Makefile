# naples — see README.md. `make demo` runs the demo, `make test` runs every test.

GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS_BIN := $(BIN)/tools
CMDS      := nimbus naples-agent naplesctl
GOTEST    ?= $(GO) test -race -count=1 -timeout 20m

.PHONY: all build test bench fuzz demo proto proto-check bpf bpf-check tools vet clean release package screenshots

all: build

build:
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

test:
	$(GO) vet ./...
	cd bench/xds && $(GO) vet ./...
	$(GOTEST) ./...

# bench runs every benchmark. Those of hal/linux and test program a kernel, or run the
# whole chain, once per iteration, which takes seconds to minutes: they run one iteration
# each (-benchtime 1x; some stop their timer while they set up, so the default would
# repeat them for long), without the default 10-minute limit.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(shell $(GO) list ./... | grep -v -e '/hal/linux$$' -e '/test$$')
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1x -timeout 60m ./hal/linux/ ./test/
	cd bench/xds && $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 0

# fuzz runs each fuzz target for FUZZTIME, one target per invocation (go test takes one
# -fuzz at a time). Their seed corpora (f.Add and testdata/fuzz/FuzzX/) run as plain tests
# under `make test`; an input a run finds failing is written to testdata/fuzz/FuzzX/, to
# be fixed and committed as a regression seed. FUZZTIME is a count of executions, not a
# duration: with a duration, Go's fuzzing coordinator can fail a target that found
# nothing ("context deadline exceeded") when its workers are starved of CPU at the end.
FUZZTIME ?= 30000x
FUZZ_TARGETS := \
	./internal/manifest:FuzzDecode \
	./internal/manifest:FuzzSimpleYAMLToJSON \
	./proto/nimbus/v1:FuzzValidate \
	./proto/nimbus/v1:FuzzPooledFrame

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "$(GO) test -run '^$$' -fuzz '^$$name$$' -fuzztime $(FUZZTIME) $$pkg"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

demo: build
	./examples/demo.sh

# screenshots rewrites the web console's screenshots, docs/ui-*.png, from a demo state in
# headless Chromium (Debian: chromium). Only this target writes them; make test does not.
screenshots:
	NAPLES_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^TestScreenshots$$' ./nimbus/console/

# tools builds the pinned code generators and the packager nfpm from tools/go.mod, and
# protoc-gen-naples-comments, which keeps the .proto comments for naplesctl explain.
tools:
	cd tools && GOBIN=$(TOOLS_BIN) $(GO) install \
		github.com/bufbuild/buf/cmd/buf \
		github.com/goreleaser/nfpm/v2/cmd/nfpm \
		google.golang.org/protobuf/cmd/protoc-gen-go \
		google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto \
		github.com/cilium/ebpf/cmd/bpf2go \
		./protoc-gen-naples-comments

proto: tools
	PATH="$(TOOLS_BIN):$$PATH" $(TOOLS_BIN)/buf generate

# proto-check fails when the committed generated code differs from a fresh generation.
proto-check: proto
	git diff --exit-code -- proto
	test -z "$$(git status --porcelain -- proto)"

# bpf compiles the eBPF firewall (hal/linux/fwbpf/firewall.c) and the gateway marks
# (hal/linux/gwbpf/gateway.c) and regenerates their Go bindings with bpf2go. It needs
# clang, llvm-strip and libbpf's headers (Debian: clang llvm libbpf-dev).
bpf: tools
	PATH="$(TOOLS_BIN):$$PATH" $(GO) generate ./hal/linux/fwbpf/ ./hal/linux/gwbpf/

# bpf-check fails when the committed object or bindings differ from a fresh generation.
bpf-check: bpf
	git diff --exit-code -- hal/linux/fwbpf hal/linux/gwbpf
	test -z "$$(git status --porcelain -- hal/linux/fwbpf hal/linux/gwbpf)"

clean:
	rm -rf $(BIN) dist

# release builds static binaries (CGO_ENABLED=0) of the three commands for each platform of
# RELEASE_PLATFORMS into $(DIST)/naples-VERSION-OS-ARCH/, packs each directory into
# $(DIST)/naples-VERSION-OS-ARCH.tar.gz, builds a .deb and an .rpm of each (nfpm-packages),
# and writes the SHA-256 sums of the archives, the packages and the binaries to $(DIST)/SHA256SUMS (check them with `cd dist && sha256sum -c SHA256SUMS`).
# VERSION, which every binary prints with --version, defaults to `git describe`. Archive
# entries carry the time of the last commit, SOURCE_DATE_EPOCH, so a release built twice
# from one commit is the same bytes.
VERSION           ?= $(shell git describe --tags --always --dirty 2>/dev/null)
DIST              ?= dist
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
# Evaluated once, so that a file changing during the build cannot change the version.
VERSION           := $(VERSION)
SOURCE_DATE_EPOCH := $(SOURCE_DATE_EPOCH)

release:
	@test -n "$(VERSION)" || { echo "release: VERSION is empty (no git? set VERSION=...)" >&2; exit 1; }
	rm -rf $(DIST)/naples-$(VERSION)-* $(DIST)/naples_*.deb $(DIST)/naples-*.rpm $(DIST)/SHA256SUMS
	set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; name=naples-$(VERSION)-$$os-$$arch; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath \
			-ldflags "-s -w -X github.com/naplesnet/naples/internal/version.Version=$(VERSION)" \
			-o $(DIST)/$$name/ $(addprefix ./cmd/,$(CMDS)); \
		tar -C $(DIST) -cf $(DIST)/$$name.tar --sort=name --owner=0 --group=0 --numeric-owner \
			--mtime=@$(SOURCE_DATE_EPOCH) $$name; \
		gzip -n -f $(DIST)/$$name.tar; \
	done
	set -e; for p in $(RELEASE_PLATFORMS); do \
		$(MAKE) --no-print-directory nfpm-packages PKG_ARCH=$${p#*/} PKG_BINDIR=$(DIST)/naples-$(VERSION)-$${p%/*}-$${p#*/}; \
	done
	cd $(DIST) && sha256sum naples-$(VERSION)-*.tar.gz naples_*.deb naples-*.rpm naples-$(VERSION)-*/* > SHA256SUMS

# package builds the .deb and .rpm of the build machine's architecture from freshly built
# static binaries into $(DIST)/pkg/, faster than a whole release; the package test installs it.
PKG_DIST ?= $(DIST)/pkg
package:
	@test -n "$(VERSION)" || { echo "package: VERSION is empty (no git? set VERSION=...)" >&2; exit 1; }
	rm -rf $(PKG_DIST)
	CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags "-s -w -X github.com/naplesnet/naples/internal/version.Version=$(VERSION)" \
		-o $(PKG_DIST)/bin/ $(addprefix ./cmd/,$(CMDS))
	$(MAKE) --no-print-directory nfpm-packages PKG_ARCH=$$($(GO) env GOARCH) PKG_BINDIR=$(PKG_DIST)/bin PKG_OUT=$(PKG_DIST)

# nfpm-packages packs the binaries of PKG_BINDIR (architecture PKG_ARCH) with the units, the
# defaults, the dashboard and the docs into a .deb and an .rpm in PKG_OUT, as deploy/nfpm.yaml
# lists them. Package entries carry SOURCE_DATE_EPOCH, as the archives do.
PKG_OUT ?= $(DIST)
PKG_MTIME = $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
nfpm-packages: tools
	mkdir -p $(PKG_OUT)
	sed -e 's|$${VERSION}|$(VERSION)|g' -e 's|$${GOARCH}|$(PKG_ARCH)|g' -e 's|$${BINDIR}|$(PKG_BINDIR)|g' \
		-e 's|$${MTIME}|$(PKG_MTIME)|g' \
		deploy/nfpm.yaml > $(PKG_OUT)/nfpm-$(PKG_ARCH).yaml
	set -e; for f in deb rpm; do \
		SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(TOOLS_BIN)/nfpm package \
			--config $(PKG_OUT)/nfpm-$(PKG_ARCH).yaml --packager $$f --target $(PKG_OUT)/; \
	done
	rm $(PKG_OUT)/nfpm-$(PKG_ARCH).yaml
