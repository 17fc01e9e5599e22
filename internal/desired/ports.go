package desired

import (
	"fmt"
	"sort"
	"strings"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// resolvePorts picks the optimized ports, their protocol and target port.
func resolvePorts(opt *optv1.IstioAdaptiveRequestOptimizer, svc *corev1.Service, slices []discoveryv1.EndpointSlice, pods map[string]*corev1.Pod, clusterDomain string) ([]Port, []Problem) {
	var problems []Problem
	byNumber := map[int32]corev1.ServicePort{}
	for _, sp := range svc.Spec.Ports {
		// A number may be declared twice, once per protocol (53/TCP and
		// 53/UDP): the TCP one is the port that can be optimized.
		if prev, ok := byNumber[sp.Port]; ok && routable(prev) {
			continue
		}
		byNumber[sp.Port] = sp
	}
	type want struct {
		number   int32
		protocol optv1.Protocol
		target   *intstr.IntOrString
	}
	var wants []want
	if len(opt.Spec.ServicePorts) == 0 {
		for _, sp := range svc.Spec.Ports {
			wants = append(wants, want{number: sp.Port})
		}
	} else {
		for _, p := range opt.Spec.ServicePorts {
			wants = append(wants, want{number: p.Number, protocol: p.Protocol, target: p.TargetPort})
		}
	}
	var ports []Port
	seen := map[int32]bool{}
	for _, w := range wants {
		if seen[w.number] {
			continue
		}
		seen[w.number] = true
		sp, ok := byNumber[w.number]
		if !ok {
			problems = append(problems, Problem{Reason: "PortNotFound",
				Message: fmt.Sprintf("Service %s/%s has no port %d", svc.Namespace, svc.Name, w.number)})
			continue
		}
		if !routable(sp) {
			problems = append(problems, Problem{Reason: "UnsupportedProtocol",
				Message: fmt.Sprintf("port %d of Service %s/%s is %s; Istio routes TCP only", w.number, svc.Namespace, svc.Name, sp.Protocol)})
			continue
		}
		mesh := meshProtocol(sp)
		if p, skip := tlsPortProblem(svc, sp, mesh, len(opt.Spec.ServicePorts) > 0, clusterDomain); p != nil {
			problems = append(problems, *p)
			if skip {
				continue
			}
		}
		proto := mesh
		if w.protocol != "" {
			proto = strings.ToUpper(string(w.protocol))
		}
		target := sp.TargetPort
		if w.target != nil {
			target = *w.target
		}
		if target.Type == intstr.Int && target.IntVal == 0 && target.StrVal == "" {
			target = intstr.FromInt32(sp.Port)
		}
		p := Port{
			Name:         portName(proto, w.number, ""),
			Number:       w.number,
			Protocol:     proto,
			meshProtocol: mesh,
			serviceName:  sp.Name,
			target:       target,
		}
		if target.Type == intstr.Int {
			p.TargetPort = uint32(target.IntVal)
		} else {
			n := namedTargetFromSlices(sp.Name, slices)
			if n == 0 || w.target != nil {
				n = namedTargetFromPods(target.StrVal, pods)
			}
			if n == 0 {
				problems = append(problems, Problem{Reason: "TargetPortUnresolved",
					Message: fmt.Sprintf("target port %q of port %d is not declared by any pod yet", target.StrVal, w.number)})
				continue
			}
			p.TargetPort = n
		}
		ports = append(ports, p)
	}
	return ports, problems
}

// routable says whether Istio can route the Service port (TCP only).
func routable(sp corev1.ServicePort) bool {
	return sp.Protocol != corev1.ProtocolUDP && sp.Protocol != corev1.ProtocolSCTP
}

// namedTargetFromSlices finds the number a named target port resolved to:
// EndpointSlice ports are named after the Service port.
func namedTargetFromSlices(servicePortName string, slices []discoveryv1.EndpointSlice) uint32 {
	for _, s := range sortedSlices(slices) {
		for _, p := range s.Ports {
			if p.Port != nil && ptrString(p.Name) == servicePortName {
				return uint32(*p.Port)
			}
		}
	}
	return 0
}

func namedTargetFromPods(name string, pods map[string]*corev1.Pod) uint32 {
	names := make([]string, 0, len(pods))
	for n := range pods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, c := range pods[n].Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == name {
					return uint32(cp.ContainerPort)
				}
			}
		}
	}
	return 0
}
