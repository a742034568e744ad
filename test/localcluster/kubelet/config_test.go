package kubelet

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func testConfig(dir string) Config {
	return Config{
		StateDir: dir, AssetsDir: "/assets", NodeName: "n1", NodeIP: "10.244.0.1", Bridge: "obx0",
		PodCIDR: "10.244.0.0/16", ClusterDNS: "10.96.0.10", KubeletPort: 10250, HealthzPort: 10248,
		PKIDir: "/pki", Kubeconfig: "/kc", PidDir: "/pids", LogDir: "/logs",
	}
}

func TestContainerdConfigHasThisMachinesSettings(t *testing.T) {
	t.Parallel()
	got := testConfig("/state").containerdConfig()
	for _, want := range []string{
		`root = "/state/node/containerd/root"`,
		`address = "/state/node/containerd/containerd.sock"`,
		`sandbox_image = "` + PauseImage + `"`,
		"restrict_oom_score_adj = true",
		"SystemdCgroup = false",
		`conf_dir = "/state/node/cni/net.d"`,
		`bin_dir = "/usr/lib/cni"`,
	} {
		require.Contains(t, got, want)
	}
}

func TestKubeletConfig(t *testing.T) {
	t.Parallel()
	b, err := testConfig("/state").kubeletConfig()
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, "KubeletConfiguration", m["kind"])
	require.Equal(t, false, m["failCgroupV1"], "the host has a hybrid cgroup v1 hierarchy")
	require.Equal(t, "cgroupfs", m["cgroupDriver"])
	require.Equal(t, "/outbox-local-cluster", m["cgroupRoot"])
	require.Equal(t, "unix:///state/node/containerd/containerd.sock", m["containerRuntimeEndpoint"])
	require.Equal(t, "10.244.0.1", m["address"])
	require.Equal(t, false, m["makeIPTablesUtilChains"], "no kubelet chains outlive the cluster")
	require.Equal(t, map[string]any{"mode": "Webhook"}, m["authorization"])
	auth := m["authentication"].(map[string]any)
	require.Equal(t, map[string]any{"enabled": false}, auth["anonymous"])
	require.Equal(t, []any{"10.96.0.10"}, m["clusterDNS"])
}

func TestCNIConfig(t *testing.T) {
	t.Parallel()
	b, err := testConfig("/state").cniConfig()
	require.NoError(t, err)
	var m struct {
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPMasq bool   `json:"ipMasq"`
			IPAM   struct {
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(b, &m))
	require.Len(t, m.Plugins, 2)
	require.Equal(t, "bridge", m.Plugins[0].Type)
	require.Equal(t, "obx0", m.Plugins[0].Bridge)
	require.False(t, m.Plugins[0].IPMasq, "no traffic is masqueraded off the machine")
	require.Equal(t, "/state/node/cni/ipam", m.Plugins[0].IPAM.DataDir)
	require.Equal(t, map[string]string{"subnet": "10.244.0.0/16", "gateway": "10.244.0.1"}, m.Plugins[0].IPAM.Ranges[0][0])
	require.Equal(t, "portmap", m.Plugins[1].Type)
}

func TestSplitRule(t *testing.T) {
	t.Parallel()
	for line, want := range map[string][]string{
		"-N CNI-HOSTPORT-DNAT": {"-N", "CNI-HOSTPORT-DNAT"},
		`-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ`: {
			"-A", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", "CNI-HOSTPORT-MASQ",
		},
		`-A X --comment "a \"b\""`: {"-A", "X", "--comment", `a "b"`},
		"":                         nil,
	} {
		require.Equal(t, want, splitRule(line), line)
	}
}

func TestWriteImageArchive(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "img.tar")
	require.NoError(t, WriteImageArchive(path, Image{
		Name: "localhost/x/y:1", Entrypoint: []string{"/y"}, User: "1:1",
		Files: []ImageFile{{Path: "/y", Data: []byte("#!"), Mode: 0o755}},
	}))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Positive(t, st.Size())
}
