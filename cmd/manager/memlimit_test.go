package main

import (
	"math"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestSoftMemoryLimit(t *testing.T) {
	t.Parallel()
	const mi = 1 << 20
	v2 := func(s string) fstest.MapFS { return fstest.MapFS{cgroupV2MemoryMax: {Data: []byte(s + "\n")}} }
	v1 := func(s string) fstest.MapFS { return fstest.MapFS{cgroupV1MemoryMax: {Data: []byte(s + "\n")}} }
	cases := []struct {
		name    string
		env     map[string]string
		root    fstest.MapFS
		want    memoryLimit
		wantErr string
	}{
		{"GOMEMLIMITWins", map[string]string{"GOMEMLIMIT": "100MiB", containerMemoryLimitEnv: "268435456"}, v2("1000"),
			memoryLimit{Source: "GOMEMLIMIT"}, ""},
		{"ContainerLimitFromTheDownwardAPI", map[string]string{containerMemoryLimitEnv: "268435456"}, v2("1000"),
			memoryLimit{Bytes: 256 * mi * 9 / 10, Source: containerMemoryLimitEnv}, ""},
		{"ContainerLimitNotANumber", map[string]string{containerMemoryLimitEnv: "256Mi"}, nil,
			memoryLimit{}, "want the container's memory limit in bytes"},
		{"CgroupV2", nil, v2("536870912"), memoryLimit{Bytes: 512 * mi * 9 / 10, Source: "/" + cgroupV2MemoryMax}, ""},
		{"CgroupV2Unlimited", nil, v2("max"), memoryLimit{}, ""},
		{"CgroupV1", nil, v1("268435456"), memoryLimit{Bytes: 256 * mi * 9 / 10, Source: "/" + cgroupV1MemoryMax}, ""},
		{"CgroupV1Unlimited", nil, v1("9223372036854771712"), memoryLimit{}, ""},
		{"CgroupGarbage", nil, v2("lots"), memoryLimit{}, `holds "lots"`},
		{"NothingKnown", nil, fstest.MapFS{}, memoryLimit{}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := softMemoryLimit(env(tc.env), tc.root)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestMemoryLimitString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "none", memoryLimitString(math.MaxInt64))
	require.Equal(t, "230MiB", memoryLimitString(256*(1<<20)*9/10))
}
