package podspec

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// EnvVar is one resolved variable.
type EnvVar struct{ Name, Value string }

// Sources are the objects a container's environment may reference.
type Sources interface {
	Secret(namespace, name string) (*corev1.Secret, error)
	ConfigMap(namespace, name string) (*corev1.ConfigMap, error)
	// Services returns the Services of namespace and default/kubernetes.
	Services(namespace string) ([]*corev1.Service, error)
}

// Runtime are the values fieldRef may read that the pod object does not hold yet.
type Runtime struct {
	PodIP, HostIP string
}

// ConfigError is a container that cannot be started as written
// (CreateContainerConfigError in the kubelet).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// Env resolves the environment of container c of pod, in the kubelet's order:
// the service variables, then envFrom, then env (later wins), each env value
// expanded against the variables defined before it and the service variables.
func Env(pod *corev1.Pod, c *corev1.Container, src Sources, rt Runtime) ([]EnvVar, error) {
	var out []EnvVar
	set := func(name, value string) {
		for i := range out {
			if out[i].Name == name {
				out[i].Value = value
				return
			}
		}
		out = append(out, EnvVar{name, value})
	}
	svcEnv, err := serviceEnv(pod, src)
	if err != nil {
		return nil, err
	}
	for _, e := range svcEnv {
		set(e.Name, e.Value)
	}
	for _, from := range c.EnvFrom {
		data, err := envFromData(pod.Namespace, from, src)
		if err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(data) {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, Expand(e.Value, MapLookup(out)))
			continue
		}
		v, ok, err := valueFrom(pod, c, e, src, rt)
		if err != nil {
			return nil, err
		}
		if ok {
			set(e.Name, v)
		}
	}
	return out, nil
}

func envFromData(ns string, from corev1.EnvFromSource, src Sources) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		cm, err := src.ConfigMap(ns, from.ConfigMapRef.Name)
		if err != nil {
			if optional(from.ConfigMapRef.Optional) {
				return nil, nil
			}
			return nil, configErrorf("configmap %q not found", from.ConfigMapRef.Name)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := src.Secret(ns, from.SecretRef.Name)
		if err != nil {
			if optional(from.SecretRef.Optional) {
				return nil, nil
			}
			return nil, configErrorf("secret %q not found", from.SecretRef.Name)
		}
		m := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			m[k] = string(v)
		}
		return m, nil
	}
	return nil, nil
}

func optional(b *bool) bool { return b != nil && *b }

func valueFrom(pod *corev1.Pod, c *corev1.Container, e corev1.EnvVar, src Sources, rt Runtime) (string, bool, error) {
	vf := e.ValueFrom
	switch {
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		s, err := src.Secret(pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("secret %q not found", ref.Name)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return string(v), true, nil
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		cm, err := src.ConfigMap(pod.Namespace, ref.Name)
		if err != nil {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("configmap %q not found", ref.Name)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return v, true, nil
	case vf.FieldRef != nil:
		v, err := FieldRef(pod, vf.FieldRef.FieldPath, rt)
		return v, err == nil, err
	case vf.ResourceFieldRef != nil:
		v, err := resourceFieldRef(c, vf.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, configErrorf("env %s: unsupported valueFrom", e.Name)
}

// FieldRef returns the value of a downward-API field path of pod.
func FieldRef(pod *corev1.Pod, path string, rt Runtime) (string, error) {
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return rt.PodIP, nil
	case "status.hostIP", "status.hostIPs":
		return rt.HostIP, nil
	}
	return "", configErrorf("unsupported fieldRef %q", path)
}

// subscript parses prefix['key'].
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	key, ok := strings.CutSuffix(rest, "']")
	return key, ok
}

func resourceFieldRef(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	var q resource.Quantity
	var found bool
	switch ref.Resource {
	case "limits.cpu":
		q, found = c.Resources.Limits[corev1.ResourceCPU]
	case "limits.memory":
		q, found = c.Resources.Limits[corev1.ResourceMemory]
	case "requests.cpu":
		q, found = c.Resources.Requests[corev1.ResourceCPU]
	case "requests.memory":
		q, found = c.Resources.Requests[corev1.ResourceMemory]
	default:
		return "", configErrorf("unsupported resourceFieldRef %q", ref.Resource)
	}
	if !found {
		// The kubelet falls back to the node's allocatable; a process on this
		// host is bounded by the host.
		return "0", nil
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if strings.HasSuffix(ref.Resource, "cpu") {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

// serviceEnv returns the {SVC}_SERVICE_HOST, {SVC}_PORT... variables of the
// kubernetes Service and, with enableServiceLinks (the default), of every
// Service of the pod's namespace that has a ClusterIP.
func serviceEnv(pod *corev1.Pod, src Sources) ([]EnvVar, error) {
	svcs, err := src.Services(pod.Namespace)
	if err != nil {
		return nil, err
	}
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	byName := map[string]*corev1.Service{}
	for _, s := range svcs {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if s.Namespace == "default" && s.Name == "kubernetes" {
			byName[s.Name] = s
		} else if s.Namespace == pod.Namespace && links {
			if _, taken := byName[s.Name]; !taken || pod.Namespace != "default" {
				byName[s.Name] = s
			}
		}
	}
	var out []EnvVar
	for _, name := range sortedKeys(byName) {
		out = append(out, ServiceVars(byName[name])...)
	}
	return out, nil
}

// ServiceVars are the docker-link style variables of one Service.
func ServiceVars(s *corev1.Service) []EnvVar {
	if len(s.Spec.Ports) == 0 {
		return nil
	}
	name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
	host := s.Spec.ClusterIP
	first := s.Spec.Ports[0]
	out := []EnvVar{
		{name + "_SERVICE_HOST", host},
		{name + "_SERVICE_PORT", strconv.Itoa(int(first.Port))},
	}
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			out = append(out, EnvVar{name + "_SERVICE_PORT_" + strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_")), strconv.Itoa(int(p.Port))})
		}
	}
	proto := strings.ToLower(string(first.Protocol))
	if proto == "" {
		proto = "tcp"
	}
	out = append(out, EnvVar{name + "_PORT", fmt.Sprintf("%s://%s:%d", proto, host, first.Port)})
	for _, p := range s.Spec.Ports {
		pr := string(p.Protocol)
		if pr == "" {
			pr = "TCP"
		}
		prefix := fmt.Sprintf("%s_PORT_%d_%s", name, p.Port, strings.ToUpper(pr))
		out = append(out,
			EnvVar{prefix, fmt.Sprintf("%s://%s:%d", strings.ToLower(pr), host, p.Port)},
			EnvVar{prefix + "_PROTO", strings.ToLower(pr)},
			EnvVar{prefix + "_PORT", strconv.Itoa(int(p.Port))},
			EnvVar{prefix + "_ADDR", host},
		)
	}
	return out
}

// Environ formats env as NAME=value strings.
func Environ(env []EnvVar) []string {
	out := make([]string, len(env))
	for i, e := range env {
		out[i] = e.Name + "=" + e.Value
	}
	return out
}
