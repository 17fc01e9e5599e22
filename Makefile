# Build, test and deployment targets for the Istio adaptive weight optimizer.
#
# Every tool is built from the Go module proxy into bin/ the first time it is
# needed and reused after that. Nothing else is downloaded: setup-envtest's
# release tarballs are replaced by kube-apiserver and etcd built from source
# (hack/tools/*), the same way as istiod and Prometheus for the conformance
# tests and the demo. `make help` lists the targets.

# Image the manager is built into and deployed from.
IMG ?= controller:latest

# Platforms docker-buildx builds for.
PLATFORMS ?= linux/amd64,linux/arm64,linux/s390x,linux/ppc64le

# Container tool used by docker-build and docker-push (docker or podman).
CONTAINER_TOOL ?= docker

KUBECTL ?= kubectl

# Extra flags for `make run`, e.g. RUN_ARGS="--prometheus-url=http://127.0.0.1:9090".
RUN_ARGS ?=

# `go test` flags. Integration suites start real servers (kube-apiserver, etcd,
# istiod, Prometheus) and some assert sub-second reactions, so test binaries run
# one at a time by default on small machines; compilation still uses every core
# because `vet` warms the build cache first. Raise TEST_PARALLELISM on a big box.
TEST_PARALLELISM ?= 1
TEST_TIMEOUT ?= 30m
TEST_PACKAGES ?= ./...
TEST_ARGS ?=
# The race detector runs on every test package (a race fails `make test`)
# except TEST_NORACE_PACKAGES, which -race slows several times over:
# test/bench's tests are long balancing simulations, each a single-goroutine
# CPU loop (only RunAll's small worker pool is concurrent); internal/weights
# (the pure engine) and its tests start no goroutine at all, so the detector
# has nothing to watch there, and it took 18 of the 30 minutes TEST_TIMEOUT
# allows a test binary (200 s without). The engine's use from the manager's
# goroutines is raced in controllers' and test/'s packages; a go statement in
# internal/weights fails TestPackageStartsNoGoroutine.
# `make test TEST_NORACE_PACKAGES=` races them too; TEST_RACE= turns it off.
TEST_RACE ?= -race
TEST_NORACE_PACKAGES ?= ./test/bench/... ./internal/weights/...
test_race_pkgs = $(filter-out $(shell go list $(TEST_NORACE_PACKAGES)),$(shell go list $(TEST_PACKAGES)))
test_norace_pkgs = $(filter $(shell go list $(TEST_NORACE_PACKAGES)),$(shell go list $(TEST_PACKAGES)))

# Flags for the balancing benchmark (test/bench) and the local demo (test/demo).
BENCH_ARGS ?= --all test/bench/scenarios
# Seeds of make bench-docs (docs/benchmarks.md and the README's figures) and
# of the guard's baseline (make bench-baseline; TestIssueTargets runs 1-16).
BENCH_DOCS_SEEDS ?= 1-16
BENCH_GUARD_SEEDS ?= 1-16
# make bench-random: how many random scenarios, the seed they are drawn
# from, and the seeds each is run on (docs/random-scenarios.md).
RANDOM ?= 60
RANDOM_SEED ?= 1
RANDOM_RUN_SEEDS ?= 1-8
DEMO_ARGS ?=

# Where controller-gen writes. The generated-files test (test/generated)
# overrides these to regenerate into a temporary directory and compare.
CRD_OUTPUT_DIR ?= config/crd/bases
RBAC_OUTPUT_DIR ?= config/rbac
GENERATE_PATHS ?= ./...
OBJECT_OUTPUT ?=

# Setting SHELL to bash allows bash commands to be executed by recipes.
# Options are set to exit when a recipe line exits non-zero or a piped command fails.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

# The help target prints out all targets with their descriptions organized
# beneath their categories. The categories are represented by '##@' and the
# target descriptions by '##'.
.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRD and the manager's ClusterRole from kubebuilder markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." \
		output:crd:artifacts:config=$(CRD_OUTPUT_DIR) output:rbac:artifacts:config=$(RBAC_OUTPUT_DIR)

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods for the API types.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="$(GENERATE_PATHS)" $(OBJECT_OUTPUT)

.PHONY: fmt
fmt: ## Run go fmt against code.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet against code (test files included).
	go vet ./...

.PHONY: test
# test does not regenerate the CRDs, RBAC and deepcopy code: it checks them
# (test/generated), so stale generated files fail here and in CI alike. The
# last two lines run Istio's own validation on the objects the operator writes:
# the golden ones (internal/desired/testdata/istio-objects.yaml, in the istiod
# module) and those of generated inputs (test/istiovalidation, its own module).
test: controller-gen fmt vet envtest istiod prometheus kustomize ## Run every test against real components (API server, istiod, Prometheus) built into bin/.
	KUBEBUILDER_ASSETS="$(LOCALBIN)" go test $(TEST_RACE) $(test_race_pkgs) -count=1 -p $(TEST_PARALLELISM) -timeout $(TEST_TIMEOUT) $(TEST_ARGS)
	$(if $(strip $(test_norace_pkgs)),KUBEBUILDER_ASSETS="$(LOCALBIN)" go test $(test_norace_pkgs) -count=1 -p $(TEST_PARALLELISM) -timeout $(TEST_TIMEOUT) $(TEST_ARGS))
	cd hack/tools/istiod && go test . -count=1 -run TestOperatorObjectsPassIstioValidation
	cd test/istiovalidation && go test . -count=1

.PHONY: test-generated
test-generated: controller-gen ## Fail if the committed CRDs, RBAC or deepcopy code differ from what controller-gen produces.
	go test ./test/generated/ -run TestGeneratedFilesUpToDate -count=1

.PHONY: bench
bench: ## Run the side-by-side balancing benchmark on every shipped scenario.
	go run ./test/bench $(BENCH_ARGS)

.PHONY: bench-probes
bench-probes: ## Run the probes: scenarios that show known limits (each file's own seed; no baseline, no guard).
	go run ./test/bench --all test/bench/probes

.PHONY: bench-docs
bench-docs: ## Regenerate docs/benchmarks.md and the README's figures from one run of the bench over BENCH_DOCS_SEEDS.
	go run ./test/bench --all test/bench/scenarios --seeds $(BENCH_DOCS_SEEDS) --markdown docs/benchmarks.md --readme README.md

.PHONY: bench-random
bench-random: ## Run the guard on RANDOM scenarios drawn from RANDOM_SEED (Services nobody tuned the engine on) and write docs/random-scenarios.md.
	go run ./test/bench --random $(RANDOM) --random-seed $(RANDOM_SEED) --seeds $(RANDOM_RUN_SEEDS) --random-doc docs/random-scenarios.md

.PHONY: bench-guard
bench-guard: ## Print the bench's regression guard (what TestIssueTargets asserts) over BENCH_GUARD_SEEDS.
	go run ./test/bench --guard test/bench/scenarios --seeds $(BENCH_GUARD_SEEDS)

.PHONY: bench-baseline
bench-baseline: ## Record the guard's baseline (test/bench/baseline.json) from the current engine.
	go run ./test/bench --guard test/bench/scenarios --seeds $(BENCH_GUARD_SEEDS) --write-baseline test/bench/baseline.json

.PHONY: bench-sensitivity
bench-sensitivity: ## Rerun the sensitivity table of the engine's constants (medians over seeds 1-8, about half an hour) for make bench-docs.
	hack/sensitivity.sh > test/bench/sensitivity.md.new && mv test/bench/sensitivity.md.new test/bench/sensitivity.md

.PHONY: scale
scale: envtest ## Measure reconcile cost (pure part, and the manager binary's at 1 x 4000 and 200 x 50 pods), object and query sizes, and the manager's memory at 200 optimizers x 50 pods (minutes; docs/scale.md).
	SCALE=full KUBEBUILDER_ASSETS="$(LOCALBIN)" go test ./test/scale -count=1 -v -timeout 45m -run 'TestReconcileCostAtScale|TestBeyondTheLimitNothingIsComputed|TestMirrorReconcileTimeBlackBox|TestManagerMemoryAtScale'

.PHONY: demo
# The demo uses the committed CRD, so it does not wait for controller-gen.
demo: envtest istiod prometheus ## Run the local demo: API server, Prometheus, istiod, the operator and a simulated fleet on loopback.
	KUBEBUILDER_ASSETS="$(LOCALBIN)" go run ./test/demo $(DEMO_ARGS)

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager binary into bin/manager.
	go build -o $(LOCALBIN)/manager ./cmd

.PHONY: run
run: manifests generate fmt vet ## Run the manager from your host against the current kubeconfig (RUN_ARGS adds flags).
	go run ./cmd --leader-elect=false $(RUN_ARGS)

# docker-build and docker-buildx need a container engine; the Dockerfile builds
# the manager itself, so nothing from bin/ is copied into the image.
.PHONY: docker-build
docker-build: ## Build the manager's container image (IMG).
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the manager's container image (IMG).
	$(CONTAINER_TOOL) push $(IMG)

# The Dockerfile's builder stage runs on the build platform and cross-compiles
# (GOOS/GOARCH from TARGETOS/TARGETARCH), so no emulation is needed for the Go
# build; a buildx builder with the docker-container driver makes the
# multi-platform manifest list.
BUILDX_BUILDER ?= istio-adaptive-builder
.PHONY: docker-buildx
docker-buildx: ## Build and push the image for PLATFORMS (amd64, arm64, s390x, ppc64le) with buildx.
	-$(CONTAINER_TOOL) buildx create --name $(BUILDX_BUILDER) --driver docker-container >/dev/null 2>&1
	status=0; $(CONTAINER_TOOL) buildx build --builder $(BUILDX_BUILDER) --push --platform=$(PLATFORMS) --tag $(IMG) . || status=$$?; \
		$(CONTAINER_TOOL) buildx rm $(BUILDX_BUILDER) >/dev/null 2>&1 || true; exit $$status

# The image is set in a throw-away overlay under dist/ rather than by editing
# config/manager, so building an installer never leaves the work tree dirty.
.PHONY: build-installer
build-installer: manifests generate kustomize ## Write dist/install.yaml: CRDs, RBAC and the manager Deployment with IMG.
	$(call image-overlay,dist/overlay)
	$(KUSTOMIZE) build dist/overlay > dist/install.yaml
	@echo "Wrote dist/install.yaml (image $(IMG))"

##@ Helm chart

CHART ?= charts/istio-adaptive-weight-optimizer
# What the chart takes from config/ unchanged: the CRD, the rules of every
# Role and ClusterRole, the alert rules and the dashboard. Helm cannot read
# files outside the chart, so they are copied; test/chart fails when a copy
# differs from config/ (run this target after `make manifests`).
CHART_RBAC_FILES = role.yaml leader_election_role.yaml metrics_auth_role.yaml metrics_reader_role.yaml \
	istioadaptiverequestoptimizer_admin_role.yaml istioadaptiverequestoptimizer_editor_role.yaml \
	istioadaptiverequestoptimizer_viewer_role.yaml remote_secrets_role.yaml

.PHONY: chart-sync
chart-sync: ## Copy the CRD, RBAC rules, alerts and dashboard from config/ into the Helm chart.
	@rm -rf $(CHART)/crds $(CHART)/files/rbac && mkdir -p $(CHART)/crds $(CHART)/files/rbac
	cp config/crd/bases/*.yaml $(CHART)/crds/
	cp $(addprefix config/rbac/,$(CHART_RBAC_FILES)) $(CHART)/files/rbac/
	cp config/prometheus/alerts.yaml $(CHART)/files/alerts.yaml
	cp config/grafana/istio-adaptive-optimizer.json $(CHART)/files/dashboard.json

.PHONY: chart-lint
chart-lint: helm ## Lint the Helm chart with its default and its all-options values.
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) -f test/chart/testdata/all-options.yaml

##@ Deployment

ifndef ignore-not-found
  ignore-not-found = false
endif

.PHONY: install
install: manifests kustomize ## Install the CRDs into the cluster of the current kubeconfig.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests kustomize ## Remove the CRDs from the cluster. Call with ignore-not-found=true to ignore resource not found errors.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

.PHONY: deploy
deploy: manifests kustomize ## Deploy the manager (image IMG) with its CRDs and RBAC to the cluster.
	$(call image-overlay,dist/overlay)
	$(KUSTOMIZE) build dist/overlay | $(KUBECTL) apply --server-side -f -

# Optimizers are deleted first, while the manager still runs, so it removes the
# routing objects it owns (traffic goes back to the plain Service) and releases
# its finalizers; deleting the CRDs with the manager gone would leave them stuck.
.PHONY: undeploy
undeploy: kustomize ## Delete every optimizer, then the manager, its RBAC and the CRDs. Call with ignore-not-found=true to ignore resource not found errors.
	-$(KUBECTL) delete istioadaptiverequestoptimizers.optimization.liorfranko.github.io --all --all-namespaces --ignore-not-found --timeout=2m
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

# image-overlay writes a kustomization in $(1), two levels below the repo
# root, that uses config/default with the manager image set to $(IMG).
define image-overlay
	@rm -rf $(1) && mkdir -p $(1)
	cd $(1) && $(KUSTOMIZE) create --resources ../../config/default && $(KUSTOMIZE) edit set image controller=$(IMG)
endef

##@ Dependencies

## Location to install dependencies to
LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

# Tool binaries. Each is built as <name>-<version> and linked to <name>, so a
# version bump builds the new one and a warm run builds nothing.
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
KUSTOMIZE ?= $(LOCALBIN)/kustomize
KUBE_APISERVER ?= $(LOCALBIN)/kube-apiserver
ETCD ?= $(LOCALBIN)/etcd
PILOT_DISCOVERY ?= $(LOCALBIN)/pilot-discovery
PROMETHEUS ?= $(LOCALBIN)/prometheus
HELM ?= $(LOCALBIN)/helm

## Tool versions
CONTROLLER_TOOLS_VERSION ?= v0.23.0
# v5.8.3 needs Go 1.27; this project builds with Go 1.26.
KUSTOMIZE_VERSION ?= v5.8.2
# Helm 3 (the line every platform team runs); the chart is linted, rendered and
# dry-run applied by test/chart.
HELM_VERSION ?= v3.22.0
# The servers are built from their own modules under hack/tools (they need
# replace or pin lines that `go install pkg@version` refuses); their versions
# are read from those go.mod files, which are the one place to change them.
gomod-version = $(shell awk '$$1 == "$(2)" { print $$2; exit } $$1 == "require" && $$2 == "$(2)" { print $$3; exit }' hack/tools/$(1)/go.mod)
KUBERNETES_VERSION := $(call gomod-version,kube-apiserver,k8s.io/kubernetes)
ETCD_VERSION := $(call gomod-version,etcd,go.etcd.io/etcd/server/v3)
ISTIO_VERSION := $(call gomod-version,istiod,istio.io/istio)
PROMETHEUS_VERSION := $(call gomod-version,prometheus,github.com/prometheus/prometheus)
ifeq (,$(and $(KUBERNETES_VERSION),$(ETCD_VERSION),$(ISTIO_VERSION),$(PROMETHEUS_VERSION)))
$(error could not read the tool versions from hack/tools/*/go.mod)
endif

# The phony tool targets also (re)point the unversioned name at the wanted
# version, which is what tests and recipes use (KUBEBUILDER_ASSETS=bin).
.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)-$(CONTROLLER_TOOLS_VERSION) ## Build controller-gen into bin/ if absent.
	$(call link-tool,$<,$(CONTROLLER_GEN))
$(CONTROLLER_GEN)-$(CONTROLLER_TOOLS_VERSION): | $(LOCALBIN)
	$(call go-install-tool,$@,sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: kustomize
kustomize: $(KUSTOMIZE)-$(KUSTOMIZE_VERSION) ## Build kustomize into bin/ if absent.
	$(call link-tool,$<,$(KUSTOMIZE))
$(KUSTOMIZE)-$(KUSTOMIZE_VERSION): | $(LOCALBIN)
	$(call go-install-tool,$@,sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

.PHONY: envtest
envtest: $(KUBE_APISERVER)-$(KUBERNETES_VERSION) $(ETCD)-$(ETCD_VERSION) ## Build the envtest binaries (kube-apiserver, etcd) into bin/ if absent.
	$(call link-tool,$(KUBE_APISERVER)-$(KUBERNETES_VERSION),$(KUBE_APISERVER))
	$(call link-tool,$(ETCD)-$(ETCD_VERSION),$(ETCD))
$(KUBE_APISERVER)-$(KUBERNETES_VERSION): | $(LOCALBIN)
	$(call go-build-tool,$@,kube-apiserver,k8s.io/kubernetes/cmd/kube-apiserver)
$(ETCD)-$(ETCD_VERSION): | $(LOCALBIN)
	$(call go-build-tool,$@,etcd,go.etcd.io/etcd/server/v3)

.PHONY: istiod
istiod: $(PILOT_DISCOVERY)-$(ISTIO_VERSION) ## Build istiod (pilot-discovery) into bin/ if absent.
	$(call link-tool,$<,$(PILOT_DISCOVERY))
$(PILOT_DISCOVERY)-$(ISTIO_VERSION): | $(LOCALBIN)
	$(call go-build-tool,$@,istiod,istio.io/istio/pilot/cmd/pilot-discovery)

.PHONY: prometheus
prometheus: $(PROMETHEUS)-$(PROMETHEUS_VERSION) ## Build Prometheus into bin/ if absent.
	$(call link-tool,$<,$(PROMETHEUS))
$(PROMETHEUS)-$(PROMETHEUS_VERSION): | $(LOCALBIN)
	$(call go-build-tool,$@,prometheus,github.com/prometheus/prometheus/cmd/prometheus)

.PHONY: helm
helm: $(HELM)-$(HELM_VERSION) ## Build helm into bin/ if absent.
	$(call link-tool,$<,$(HELM))
# Stamped like a release build: `helm version` tells the version, and
# `helm template` assumes the Kubernetes version the tests run (envtest's
# kube-apiserver) instead of go install's 1.20.
HELM_K8S_MINOR = $(word 2,$(subst ., ,$(KUBERNETES_VERSION)))
HELM_LDFLAGS = -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))
$(HELM)-$(HELM_VERSION): | $(LOCALBIN)
	$(call go-install-tool,$@,helm.sh/helm/v3/cmd/helm,$(HELM_VERSION),-ldflags '$(HELM_LDFLAGS)')

# The chart tests (test/chart) need helm; the test target's own line lists the
# other tools.
test: helm

# On a fresh machine the tools take about 25 minutes on 2 cores (most of it
# kube-apiserver); hack/build-tool.sh prints which one is building and an
# elapsed-time line every 20 s. `make -j2 tools` builds two at a time.
.PHONY: tools
tools: controller-gen kustomize envtest istiod prometheus helm ## Build every tool above.

# link-tool points the unversioned name $2 at the versioned binary $1, leaving
# a correct link untouched (tests may be starting the binary).
define link-tool
@[ "$$(readlink -- "$(2)")" = "$(notdir $(1))" ] || ln -sfn "$(notdir $(1))" "$(2)"
endef

# Both helpers build into a temporary name and rename at the end, so an
# interrupted build never leaves a file that looks complete.

# go-install-tool installs a module at a version with `go install`.
# $1 - versioned output path, $2 - package, $3 - version, $4 - extra go flags
define go-install-tool
@echo "Building $(2)@$(3) into $(1)"
@rm -rf "$(1).tmp" && mkdir -p "$(1).tmp"
@GOBIN="$(1).tmp" hack/build-tool.sh $(notdir $(1)) -- go install $(4) $(2)@$(3)
@mv "$(1).tmp"/* "$(1)" && rm -rf "$(1).tmp"
endef

# go-build-tool builds a package with `go build` inside the module that pins
# it, hack/tools/<dir>.
# $1 - versioned output path, $2 - directory under hack/tools, $3 - package
define go-build-tool
@echo "Building $(3) into $(1) (module hack/tools/$(2))"
@cd hack/tools/$(2) && ../../build-tool.sh $(notdir $(1)) -- go build -o "$(1).tmp" $(3)
@mv "$(1).tmp" "$(1)"
endef
