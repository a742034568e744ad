package kubelet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The cluster DNS add-on: CoreDNS (test/localcluster/coredns, built by
// hack/setup-envtest.sh --with-node) in kube-system, behind the Service
// kube-dns at ClusterDNS, as kubeadm and kind install it.
const (
	// CoreDNSImage is made by Start from the CoreDNS binary: never pulled.
	CoreDNSImage = "localhost/outbox-local-cluster/coredns:1.15.0"
	// DNSName names the Deployment, its ServiceAccount, ConfigMap and RBAC;
	// DNSService is the Service, by its conventional name.
	DNSName    = "coredns"
	DNSService = "kube-dns"
	// dnsPort is where CoreDNS listens in its pod: above 1024, so it needs
	// no capability and runs under restricted Pod Security; the Service
	// maps port 53 to it.
	dnsPort = 1053
	// dnsReadyPort serves the ready plugin's /ready, dnsHealthPort the
	// health plugin's /health.
	dnsReadyPort  = 8181
	dnsHealthPort = 8080
	dnsNamespace  = metav1.NamespaceSystem
	// dnsConfigVolume holds the Corefile, from the ConfigMap.
	dnsConfigVolume = "corefile"
)

// corefile answers for the cluster's names only: no traffic leaves the
// machine, so there is no upstream to forward other names to (they get
// SERVFAIL).
const corefile = `.:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loadbalance
}
`

// writeCoreDNSArchive packs the CoreDNS binary into CoreDNSImage, as the
// nonroot user of the project's own image.
func writeCoreDNSArchive(binary, path string) error {
	if err := WriteProgramArchive(path, CoreDNSImage, binary, "65532:65532"); err != nil {
		return fmt.Errorf("%w (hack/setup-envtest.sh --with-node builds CoreDNS)", err)
	}
	return nil
}

// coreDNSBinary is CoreDNS in the assets dir.
func (c Config) coreDNSBinary() string { return filepath.Join(c.AssetsDir, "coredns") }

// EnsureDNS creates the cluster DNS add-on where it is missing (objects
// that exist are kept: up is idempotent) and waits until CoreDNS is ready.
func EnsureDNS(ctx context.Context, cs kubernetes.Interface, c Config) error {
	labels := map[string]string{"k8s-app": DNSService}
	meta := metav1.ObjectMeta{Name: DNSName, Namespace: dnsNamespace, Labels: labels}
	clusterMeta := metav1.ObjectMeta{Name: "system:" + DNSName, Labels: labels}
	creates := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(dnsNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: clusterMeta, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: clusterMeta,
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterMeta.Name},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: DNSName, Namespace: dnsNamespace}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(dnsNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta,
				Data: map[string]string{"Corefile": corefile}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			// Looked up first: the API server refuses a second Service at
			// the same fixed ClusterIP as invalid (the address is taken)
			// before it finds the name taken, so a restarted cluster's
			// create would not say AlreadyExists.
			_, err := cs.CoreV1().Services(dnsNamespace).Get(ctx, DNSService, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				_, err = cs.CoreV1().Services(dnsNamespace).Create(ctx, dnsServiceObject(c, labels), metav1.CreateOptions{})
			}
			return err
		},
		func() error {
			_, err := cs.AppsV1().Deployments(dnsNamespace).Create(ctx, dnsDeployment(meta, labels), metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range creates {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the cluster DNS add-on: %w", err)
		}
	}
	return waitDNSReady(ctx, cs)
}

func dnsServiceObject(c Config, labels map[string]string) *corev1.Service {
	port := func(name string, proto corev1.Protocol) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: 53, Protocol: proto, TargetPort: intstr.FromInt32(dnsPort)}
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DNSService, Namespace: dnsNamespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels, ClusterIP: c.ClusterDNS,
			Ports: []corev1.ServicePort{port("dns", corev1.ProtocolUDP), port("dns-tcp", corev1.ProtocolTCP)},
		},
	}
}

// dnsDeployment runs one CoreDNS under restricted Pod Security: its image's
// user, a read-only root, no capability (it listens above 1024).
func dnsDeployment(meta metav1.ObjectMeta, labels map[string]string) *appsv1.Deployment {
	probe := func(path string, port int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}},
			PeriodSeconds: 2, FailureThreshold: 5}
	}
	return &appsv1.Deployment{
		ObjectMeta: meta,
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: DNSName,
					PriorityClassName:  "system-cluster-critical",
					// Its own queries go nowhere: the cluster's DNS is itself.
					DNSPolicy: corev1.DNSDefault,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name: DNSName, Image: CoreDNSImage, ImagePullPolicy: corev1.PullNever,
						Args: []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: dnsPort, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: dnsPort, Protocol: corev1.ProtocolTCP},
						},
						ReadinessProbe: probe("/ready", dnsReadyPort),
						LivenessProbe:  probe("/health", dnsHealthPort),
						VolumeMounts:   []corev1.VolumeMount{{Name: dnsConfigVolume, MountPath: "/etc/coredns", ReadOnly: true}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: []corev1.Volume{{Name: dnsConfigVolume, VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: DNSName}},
					}}},
				},
			},
		},
	}
}

// waitDNSReady waits for the CoreDNS Deployment's replica to be available.
func waitDNSReady(ctx context.Context, cs kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		d, err := cs.AppsV1().Deployments(dnsNamespace).Get(ctx, DNSName, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err
		case d.Status.AvailableReplicas >= 1:
			return nil
		default:
			last = fmt.Errorf("%d of %d replicas available", d.Status.AvailableReplicas, ptr.Deref(d.Spec.Replicas, 1))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CoreDNS (deployment %s/%s) did not become ready: %w", dnsNamespace, DNSName, errors.Join(ctx.Err(), last))
		case <-time.After(500 * time.Millisecond):
		}
	}
}
