package logical

import (
	"testing"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
