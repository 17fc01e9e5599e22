// Package chart tests the Helm chart in charts/istio-adaptive-weight-optimizer:
// it lints, renders with the default and with every option set, installs the
// same objects as config/ (CRD, RBAC, manager, metrics Service), names every
// manager flag, and its rendered objects are accepted by a real API server
// with the Prometheus Operator's and cert-manager's CRDs.
package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func TestChartLints(t *testing.T) {
	root := repoRoot(t)
	helm := tool(t, "helm", "HELM")
	for name, args := range map[string][]string{
		"default":     nil,
		"all-options": {"-f", allOptions},
	} {
		t.Run(name, func(t *testing.T) {
			out := run(t, root, helm, append([]string{"lint", "--strict", chartDir, "--kube-version", kubeVersion(t)}, args...)...)
			if !strings.Contains(string(out), "0 chart(s) failed") {
				t.Errorf("helm lint:\n%s", out)
			}
		})
	}
}

// TestChartMatchesConfig fails when the chart's CRD, RBAC, manager or metrics
// Service drift from what config/default installs, so the two install paths
// cannot diverge: rendered with the release name istio-adaptive in
// istio-adaptive-system, the chart must produce config/default's objects
// under the same names. `make chart-sync` copies what Helm cannot read from
// config/ (the CRD, the RBAC rules, the alerts and the dashboard).
func TestChartMatchesConfig(t *testing.T) {
	root := repoRoot(t)
	chart := helmTemplate(t, root, releaseNamespace)
	config := kustomizeBuild(t, root, "config/default")
	const fix = "run `make chart-sync` (or change charts/istio-adaptive-weight-optimizer/templates)"

	for _, want := range config {
		got := find(chart, want.GetKind(), want.GetName())
		if got == nil {
			if want.GetKind() == "Namespace" {
				continue // helm install --create-namespace makes it
			}
			t.Errorf("config/default installs %s; the chart has none of that name (%s)", describe(want), fix)
			continue
		}
		if got.GetNamespace() != want.GetNamespace() {
			t.Errorf("%s: chart namespace %q, config/default %q", describe(want), got.GetNamespace(), want.GetNamespace())
		}
		switch want.GetKind() {
		case "CustomResourceDefinition":
			if !reflect.DeepEqual(got.Object, want.Object) {
				t.Errorf("the chart's CRD %s differs from config/crd/bases: %s", want.GetName(), fix)
			}
		case "ClusterRole", "Role":
			same(t, describe(want)+" rules", got.Object["rules"], want.Object["rules"], fix)
		case "ClusterRoleBinding", "RoleBinding":
			same(t, describe(want)+" roleRef", got.Object["roleRef"], want.Object["roleRef"], fix)
			same(t, describe(want)+" subjects", got.Object["subjects"], want.Object["subjects"], fix)
		case "Service":
			same(t, describe(want)+" ports", portsWithoutTarget(got), portsWithoutTarget(want), "")
		case "Deployment":
			compareDeployments(t, got, want)
		}
	}
	for _, o := range chart {
		if find(config, o.GetKind(), o.GetName()) == nil {
			t.Errorf("the chart installs %s by default, config/default does not", describe(o))
		}
	}

	// The copies the chart reads its alerts and dashboard from.
	for copyPath, source := range map[string]string{
		"files/alerts.yaml":    "config/prometheus/alerts.yaml",
		"files/dashboard.json": "config/grafana/istio-adaptive-optimizer.json",
	} {
		a, err := os.ReadFile(filepath.Join(root, chartDir, copyPath))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, source))
		if err != nil {
			t.Fatal(err)
		}
		if string(a) != string(b) {
			t.Errorf("%s/%s differs from %s: %s", chartDir, copyPath, source, fix)
		}
	}
}

func same(t *testing.T, what string, got, want any, fix string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s differ from config/ (%s)\nchart:  %s\nconfig: %s", what, fix, toJSON(got), toJSON(want))
	}
}

// portsWithoutTarget compares Service ports by name and number; the chart
// targets the named container port, kustomize the number.
func portsWithoutTarget(svc *unstructured.Unstructured) []string {
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	var out []string
	for _, p := range ports {
		m := p.(map[string]any)
		out = append(out, toJSON([]any{m["name"], m["port"], m["protocol"]}))
	}
	return out
}

// compareDeployments checks what a user relies on in the manager's
// Deployment: replicas, identity, security, probes, ports, resources and the
// manager's flags (same values, boolean spelling aside).
func compareDeployments(t *testing.T, got, want *unstructured.Unstructured) {
	t.Helper()
	for _, path := range [][]string{
		{"spec", "replicas"},
		{"spec", "template", "spec", "serviceAccountName"},
		{"spec", "template", "spec", "securityContext"},
		{"spec", "template", "spec", "terminationGracePeriodSeconds"},
		{"spec", "template", "spec", "priorityClassName"},
	} {
		g, _, _ := unstructured.NestedFieldNoCopy(got.Object, path...)
		w, _, _ := unstructured.NestedFieldNoCopy(want.Object, path...)
		same(t, "Deployment "+strings.Join(path, "."), g, w, "")
	}
	gc, wc := managerContainer(t, []*unstructured.Unstructured{got}), managerContainer(t, []*unstructured.Unstructured{want})
	for _, field := range []string{"command", "ports", "securityContext", "livenessProbe", "readinessProbe", "resources", "env"} {
		same(t, "manager container "+field, gc[field], wc[field], "")
	}
	gArgs, wArgs := normalizeBools(flagArgs(containerArgs(gc))), normalizeBools(flagArgs(containerArgs(wc)))
	// The chart spells out defaults config/default leaves implicit.
	for name, value := range map[string]string{"metrics-secure": "true"} {
		if slices.Equal(gArgs[name], []string{value}) && wArgs[name] == nil {
			delete(gArgs, name)
		}
	}
	same(t, "manager flags", gArgs, wArgs, "")
}

func normalizeBools(flags map[string][]string) map[string][]string {
	for name, values := range flags {
		for i, v := range values {
			if v == "" {
				values[i] = "true"
			}
		}
		flags[name] = values
	}
	return flags
}

// flagsWithoutValue are manager flags the chart deliberately gives no value
// of their own; they can still be passed with extraArgs. A flag the binary
// gains is either rendered from a named value (set in all-options.yaml) or
// added here with the reason, so a new flag cannot be forgotten.
var flagsWithoutValue = map[string]string{
	"kubeconfig":           "in a cluster the manager uses its service account",
	"vmdb-url":             "alias of --prometheus-url (metricsBackend.url), for the seed's users",
	"metrics-cert-name":    "the chart mounts a kubernetes.io/tls Secret, whose file names are the defaults",
	"metrics-cert-key":     "as metrics-cert-name",
	"zap-devel":            "development logging; extraArgs",
	"zap-stacktrace-level": "extraArgs",
	"zap-time-encoding":    "extraArgs",
	"deny-cross-namespace": "deprecated; tenancy.allowCrossNamespace replaces it",
	"pprof-bind-address":   "profiling while debugging; extraArgs",
	"pprof-contention":     "as pprof-bind-address",
}

// TestChartCoversManagerFlags lists the manager binary's flags and fails when
// one is neither rendered from a named chart value (all-options.yaml sets
// every value) nor listed in flagsWithoutValue, and when the chart passes a
// flag the binary does not have (the pod would crash-loop).
func TestChartCoversManagerFlags(t *testing.T) {
	root := repoRoot(t)
	flags, bin := managerFlags(t, root)
	all := helmTemplate(t, root, releaseNamespace, allOptions)
	// Every value the chart renders parses as the manager's flag: numbers
	// from a values file are floats to Helm, and 33554432 rendered as
	// 3.3554432e+07 is no int flag (the pod would crash-loop). -h at the end
	// stops the manager after the arguments are parsed.
	args := append(containerArgs(managerContainer(t, all)), "-h")
	if out, _ := exec.CommandContext(t.Context(), bin, args...).CombinedOutput(); bytes.Contains(out, []byte("invalid value")) || bytes.Contains(out, []byte("invalid boolean")) {
		t.Errorf("the manager refuses the arguments the chart renders from %s:\n%s", allOptions, firstLines(out, 3))
	}
	valuesData, err := os.ReadFile(filepath.Join(root, allOptions))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		ExtraArgs []string `json:"extraArgs"`
	}
	if err := yaml.Unmarshal(valuesData, &values); err != nil {
		t.Fatal(err)
	}
	named := flagArgs(containerArgs(managerContainer(t, all)))
	for name := range flagArgs(values.ExtraArgs) {
		delete(named, name) // passed through extraArgs, not a named value
	}

	var missing []string
	for _, f := range keys(flags) {
		if _, ok := named[f]; ok {
			continue
		}
		if _, ok := flagsWithoutValue[f]; ok {
			continue
		}
		missing = append(missing, "--"+f)
	}
	if len(missing) > 0 {
		t.Errorf("the manager has flags the chart names no value for: %s.\n"+
			"Add a value to charts/istio-adaptive-weight-optimizer/values.yaml (and values.schema.json), render it in "+
			"templates/deployment.yaml and set it in %s, or list the flag in flagsWithoutValue (test/chart) with the reason it is left to extraArgs.",
			strings.Join(missing, ", "), allOptions)
	}
	for f := range flagsWithoutValue {
		if !flags[f] {
			t.Errorf("flagsWithoutValue lists --%s, which the manager no longer has", f)
		}
	}
	for name, render := range map[string][]string{"default": nil, "all-options": {allOptions}} {
		objs := helmTemplate(t, root, releaseNamespace, render...)
		for f := range flagArgs(containerArgs(managerContainer(t, objs))) {
			if !flags[f] {
				t.Errorf("%s values: the chart passes --%s, which the manager does not have", name, f)
			}
		}
	}
}

// TestChartDefaults checks what the default install promises: two replicas
// with leader election (passed explicitly, whatever the binary's default),
// a PodDisruptionBudget that keeps one of them, and no monitoring object that
// needs CRDs the cluster may lack.
func TestChartDefaults(t *testing.T) {
	root := repoRoot(t)
	objs := helmTemplate(t, root, releaseNamespace)
	deploy := mustFind(t, objs, "Deployment", releaseName+"-controller-manager")
	if r, _, _ := unstructured.NestedFieldNoCopy(deploy.Object, "spec", "replicas"); fmt.Sprint(r) != "2" {
		t.Errorf("replicas = %v, want 2", r)
	}
	args := flagArgs(containerArgs(managerContainer(t, objs)))
	if !slices.Equal(args["leader-elect"], []string{"true"}) {
		t.Errorf("--leader-elect = %v, want true passed explicitly", args["leader-elect"])
	}
	pdb := mustFind(t, objs, "PodDisruptionBudget", releaseName+"-controller-manager")
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", v)
	}
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	selector, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	for k, v := range selector {
		if podLabels[k] != v {
			t.Errorf("PodDisruptionBudget selects %s=%s, which the manager's pods lack", k, v)
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceMonitor", "PrometheusRule", "Certificate", "Issuer", "NetworkPolicy", "ConfigMap":
			t.Errorf("the default install renders %s; optional objects must be off by default", describe(o))
		}
	}
}

// TestChartMonitoring checks the monitoring objects when switched on: the
// ServiceMonitor authenticates with a service account token from a Secret
// through spec.endpoints[].authorization (not the deprecated
// bearerTokenFile), that account may read /metrics, the certificate the
// manager serves is the one the ServiceMonitor verifies, no honorLabels, and
// the rule and dashboard are config/'s.
func TestChartMonitoring(t *testing.T) {
	root := repoRoot(t)
	objs := helmTemplate(t, root, "iawo-system", allOptions)
	const fullname = "iawo"
	sm := mustFind(t, objs, "ServiceMonitor", fullname+"-controller-manager-metrics-monitor")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor has %d endpoints, want 1", len(endpoints))
	}
	ep := endpoints[0].(map[string]any)
	for _, banned := range []string{"bearerTokenFile", "honorLabels", "bearerTokenSecret"} {
		if _, ok := ep[banned]; ok {
			t.Errorf("ServiceMonitor endpoint sets %s", banned)
		}
	}
	if ep["scheme"] != "https" {
		t.Errorf("scheme = %v, want https", ep["scheme"])
	}

	// Authentication: a token Secret of a service account bound to metrics-reader.
	secretName, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
	secret := mustFind(t, objs, "Secret", secretName)
	if secret.Object["type"] != "kubernetes.io/service-account-token" || secret.GetNamespace() != sm.GetNamespace() {
		t.Errorf("token Secret %s: type %v in %s, want a service-account-token in the ServiceMonitor's namespace %s",
			secretName, secret.Object["type"], secret.GetNamespace(), sm.GetNamespace())
	}
	account := secret.GetAnnotations()["kubernetes.io/service-account.name"]
	mustFind(t, objs, "ServiceAccount", account)
	reader := mustFind(t, objs, "ClusterRole", fullname+"-metrics-reader")
	bound := false
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			if m := s.(map[string]any); ref == reader.GetName() && m["name"] == account && m["namespace"] == sm.GetNamespace() {
				bound = true
			}
		}
	}
	if !bound {
		t.Errorf("no ClusterRoleBinding gives %s/%s the metrics-reader ClusterRole", sm.GetNamespace(), account)
	}

	// TLS: the Certificate's Secret is both what the manager serves and what
	// the ServiceMonitor trusts, under a name the Certificate covers.
	caSecret, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name")
	serverName, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName")
	if skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify"); skip {
		t.Error("ServiceMonitor skips TLS verification although a certificate is provided")
	}
	cert := mustFind(t, objs, "Certificate", fullname+"-metrics-cert")
	certSecret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if caSecret != certSecret || !slices.Contains(dnsNames, serverName) {
		t.Errorf("ServiceMonitor verifies %q against Secret %q; the Certificate writes %q for %v", serverName, caSecret, certSecret, dnsNames)
	}
	svcName := fullname + "-controller-manager-metrics-service"
	mustFind(t, objs, "Service", svcName)
	if serverName != svcName+".iawo-system.svc" {
		t.Errorf("serverName %q is not the metrics Service's name", serverName)
	}
	deploy := mustFind(t, objs, "Deployment", fullname+"-controller-manager")
	volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	mounted := ""
	for _, v := range volumes {
		if m := v.(map[string]any); m["name"] == "metrics-cert" {
			mounted, _, _ = unstructured.NestedString(m, "secret", "secretName")
		}
	}
	args := flagArgs(containerArgs(managerContainer(t, objs)))
	if mounted != certSecret || len(args["metrics-cert-path"]) != 1 {
		t.Errorf("the manager mounts %q with --metrics-cert-path=%v; want the Certificate's Secret %q served", mounted, args["metrics-cert-path"], certSecret)
	}

	// The operator's own labels come back without honorLabels.
	relabel := toJSON(ep["metricRelabelings"])
	for _, want := range []string{"exported_namespace", "exported_pod", "labeldrop"} {
		if !strings.Contains(relabel, want) {
			t.Errorf("metricRelabelings lack %s: %s", want, relabel)
		}
	}

	// PrometheusRule: config/prometheus's rules, watching this release's job.
	rule := mustFind(t, objs, "PrometheusRule", fullname+"-optimizer-alerts")
	want := kustomizeBuild(t, root, "config/prometheus")
	wantRule := (*unstructured.Unstructured)(nil)
	for _, o := range want {
		if o.GetKind() == "PrometheusRule" {
			wantRule = o
		}
	}
	if wantRule == nil {
		t.Fatal("config/prometheus has no PrometheusRule")
	}
	gotSpec := strings.ReplaceAll(toJSON(rule.Object["spec"]), svcName, "istio-adaptive-controller-manager-metrics-service")
	if gotSpec != toJSON(wantRule.Object["spec"]) {
		t.Error("the chart's PrometheusRule differs from config/prometheus/alerts.yaml beyond the job name")
	}
	if !strings.Contains(toJSON(rule.Object["spec"]), `up{job=\"`+svcName+`\"}`) {
		t.Errorf("the ManagerDown alert does not watch job %s", svcName)
	}

	// Dashboard: config/grafana's JSON in a ConfigMap Grafana's sidecar picks up.
	cm := mustFind(t, objs, "ConfigMap", fullname+"-grafana-dashboard")
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack grafana_dashboard=1", cm.GetLabels())
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	source, err := os.ReadFile(filepath.Join(root, "config", "grafana", "istio-adaptive-optimizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var gotDash, wantDash any
	if err := json.Unmarshal([]byte(data["istio-adaptive-optimizer.json"]), &gotDash); err != nil {
		t.Fatalf("dashboard ConfigMap: %v", err)
	}
	if err := json.Unmarshal(source, &wantDash); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotDash, wantDash) {
		t.Error("the dashboard ConfigMap differs from config/grafana")
	}
}

// TestNetworkPolicies checks that the chart's and config/network-policy's
// NetworkPolicy select the manager's pods and open what the manager needs:
// the metrics port it listens on and the probe port inbound; DNS, the API
// server and the metrics backend outbound.
func TestNetworkPolicies(t *testing.T) {
	root := repoRoot(t)
	chart := helmTemplate(t, root, "iawo-system", allOptions)
	config := kustomizeBuild(t, root, "config/default")
	for name, pair := range map[string][2][]*unstructured.Unstructured{
		"helm":      {chart, chart},
		"kustomize": {kustomizeBuild(t, root, "config/network-policy"), config},
	} {
		t.Run(name, func(t *testing.T) {
			policies, install := pair[0], pair[1]
			var np *unstructured.Unstructured
			for _, o := range policies {
				if o.GetKind() == "NetworkPolicy" {
					np = o
				}
			}
			if np == nil {
				t.Fatal("no NetworkPolicy rendered")
			}
			var deploy *unstructured.Unstructured
			for _, o := range install {
				if o.GetKind() == "Deployment" {
					deploy = o
				}
			}
			if np.GetNamespace() != deploy.GetNamespace() {
				t.Errorf("NetworkPolicy in %s, manager in %s", np.GetNamespace(), deploy.GetNamespace())
			}
			podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
			selector, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
			if len(selector) == 0 {
				t.Error("the NetworkPolicy selects every pod of the namespace")
			}
			for k, v := range selector {
				if podLabels[k] != v {
					t.Errorf("the NetworkPolicy selects %s=%s, which the manager's pods lack", k, v)
				}
			}
			ports := func(rules string) map[string]bool {
				out := map[string]bool{}
				list, _, _ := unstructured.NestedSlice(np.Object, "spec", rules)
				for _, r := range list {
					ps, _, _ := unstructured.NestedSlice(r.(map[string]any), "ports")
					for _, p := range ps {
						m := p.(map[string]any)
						out[fmt.Sprintf("%v/%v", m["port"], m["protocol"])] = true
					}
				}
				return out
			}
			in, out := ports("ingress"), ports("egress")
			c := managerContainer(t, []*unstructured.Unstructured{deploy})
			cports, _, _ := unstructured.NestedSlice(c, "ports")
			for _, p := range cports {
				m := p.(map[string]any)
				if key := fmt.Sprintf("%v/TCP", m["containerPort"]); !in[key] {
					t.Errorf("container port %v (%v) is not open inbound: %v", m["containerPort"], m["name"], keys(in))
				}
			}
			for _, want := range []string{"53/UDP", "53/TCP", "443/TCP", "6443/TCP"} {
				if !out[want] {
					t.Errorf("egress lacks %s: %v", want, keys(out))
				}
			}
			args := flagArgs(containerArgs(c))
			if urls := args["prometheus-url"]; len(urls) == 1 {
				port := regexp.MustCompile(`:(\d+)(/|$)`).FindStringSubmatch(strings.TrimPrefix(strings.TrimPrefix(urls[0], "http://"), "https://"))
				if port == nil || !out[port[1]+"/TCP"] {
					t.Errorf("egress does not open the metrics backend's port (%s): %v", urls[0], keys(out))
				}
			}
		})
	}
}

// Values that would render a broken install are refused with a message
// saying why: two replicas without leader election (two writers), and a
// ServiceMonitor in another namespace than the certificate Secret it would
// verify the manager with.
func TestChartRefusesBrokenCombinations(t *testing.T) {
	root := repoRoot(t)
	for name, c := range map[string]struct {
		set  []string
		want string
	}{
		"two writers": {[]string{"leaderElection.enabled=false", "replicaCount=2"}, "every replica would write"},
		"certificate Secret out of the ServiceMonitor's reach": {[]string{"serviceMonitor.enabled=true", "serviceMonitor.namespace=monitoring",
			"metrics.certificate.secretName=manager-metrics-tls"}, "reads Secrets only in the ServiceMonitor's namespace"},
	} {
		args := []string{"template", releaseName, chartDir, "--kube-version", kubeVersion(t)}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		cmd := exec.CommandContext(t.Context(), tool(t, "helm", "HELM"), args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: helm template %v: error %v, want a refusal saying %q:\n%.500s", name, c.set, err, c.want, out)
		}
	}
	// One replica without leader election is a valid install.
	helmTemplate(t, root, releaseNamespace)
}

// TestChartRefusesMisspeltValues: values.schema.json refuses unknown keys, so
// `serviceMonitor.enable=true` fails instead of silently installing nothing.
func TestChartRefusesMisspeltValues(t *testing.T) {
	root := repoRoot(t)
	for _, set := range []string{"serviceMonitor.enable=true", "metricsBackend.tennant=a", "replicas=3"} {
		cmd := exec.CommandContext(t.Context(), tool(t, "helm", "HELM"), "template", releaseName, chartDir, "--set", set, "--kube-version", kubeVersion(t))
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "not allowed") {
			t.Errorf("helm template --set %s: error %v, want the schema to refuse it:\n%.500s", set, err, out)
		}
	}
}
