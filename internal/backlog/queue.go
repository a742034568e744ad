package backlog

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// lane is where a due check waits: the checks of relays whose last check
// failed wait in a lane of their own, which gets a smaller share of the
// slots (Config.MaxFailingDials, Config.MaxFailingChecks).
type lane int

const (
	laneAnswering lane = iota // new relays, and relays whose last check succeeded
	laneFailing               // relays whose last check failed
	laneCount
)

func laneOf(failing bool) lane {
	if failing {
		return laneFailing
	}
	return laneAnswering
}

// dueQueue holds the relays whose check is due and waits for a dial slot:
// a key each, not a goroutine, so a thousand due checks cost a thousand
// small entries. Each lane is first come, first served; when both lanes may
// go, the check that has waited longer goes first.
type dueQueue struct {
	seq   uint64
	lanes [laneCount][]queuedKey
}

type queuedKey struct {
	key types.NamespacedName
	seq uint64
}

// push queues key at the end of its lane.
func (q *dueQueue) push(key types.NamespacedName, l lane) {
	q.seq++
	q.lanes[l] = append(q.lanes[l], queuedKey{key: key, seq: q.seq})
}

// pop takes the check that has waited longest, of the answering lane only
// unless failingMayGo; false when none may go.
func (q *dueQueue) pop(failingMayGo bool) (types.NamespacedName, lane, bool) {
	l := laneAnswering
	switch answering, failing := q.lanes[laneAnswering], q.lanes[laneFailing]; {
	case failingMayGo && len(failing) > 0 && (len(answering) == 0 || failing[0].seq < answering[0].seq):
		l = laneFailing
	case len(answering) == 0:
		return types.NamespacedName{}, 0, false
	}
	head := q.lanes[l][0]
	q.lanes[l][0] = queuedKey{}
	q.lanes[l] = q.lanes[l][1:]
	return head.key, l, true
}

// remove drops key from the queue (a relay forgotten, or whose target
// changed, while its check waited).
func (q *dueQueue) remove(key types.NamespacedName) {
	for l := range q.lanes {
		q.lanes[l] = slices.DeleteFunc(q.lanes[l], func(k queuedKey) bool { return k.key == key })
	}
}

// len is the number of queued checks.
func (q *dueQueue) len() int { return len(q.lanes[laneAnswering]) + len(q.lanes[laneFailing]) }
