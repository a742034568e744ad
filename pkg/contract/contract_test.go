package contract_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// TestCRDDefaultsAreTheContract reads the generated CRD and checks that the
// defaults the API server applies are this package's.
func TestCRDDefaultsAreTheContract(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../config/crd/bases/relay.outbox.dev_outboxrelays.yaml")
	require.NoError(t, err)
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema schema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &crd))
	require.Len(t, crd.Spec.Versions, 1)
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.at(t, "spec")
	postgres := spec.at(t, "postgres")
	columns := postgres.at(t, "columns")
	for field, want := range map[string]string{
		"id": contract.DefaultIDColumn, "eventType": contract.DefaultEventTypeColumn, "payload": contract.DefaultPayloadColumn,
		"createdAt": contract.DefaultCreatedAtColumn, "dispatchedAt": contract.DefaultDispatchedAtColumn,
	} {
		require.Equal(t, want, columns.at(t, field).Default, "spec.postgres.columns.%s", field)
	}
	require.Equal(t, contract.DefaultTable, postgres.at(t, "table").Default)
	require.Equal(t, contract.DefaultStream, spec.at(t, "redis").at(t, "stream").Default)
}

type schema struct {
	Default    any               `json:"default"`
	Properties map[string]schema `json:"properties"`
}

func (s schema) at(t *testing.T, name string) schema {
	t.Helper()
	p, ok := s.Properties[name]
	require.True(t, ok, "no property %s", name)
	return p
}
