package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// secretCache remembers, by resourceVersion, the values of the Secret keys
// that OutboxRelays reference, so that a reconcile reads a Secret from the
// API server only when it changed: the resourceVersion comes from the
// manager's metadata-only informer of Secrets, which is in memory anyway.
//
// It holds only the keys some relay references, only for Secrets some relay
// references; a Secret's entry goes when its last relay stops referencing
// it. The values never leave the process (the relay pods read the Secrets
// themselves, through secretKeyRef).
type secretCache struct {
	mu      sync.Mutex
	secrets map[types.NamespacedName]*secretEntry
	// refs is what each relay referenced at its last resolve.
	refs map[types.NamespacedName][]types.NamespacedName
}

type secretEntry struct {
	resourceVersion string
	values          map[string][]byte
	users           map[types.NamespacedName]struct{}
}

func newSecretCache() *secretCache {
	return &secretCache{
		secrets: map[types.NamespacedName]*secretEntry{},
		refs:    map[types.NamespacedName][]types.NamespacedName{},
	}
}

// get returns the value of key in the Secret at resourceVersion, if known.
func (c *secretCache) get(secret types.NamespacedName, resourceVersion, key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.secrets[secret]
	if !ok || e.resourceVersion != resourceVersion {
		return nil, false
	}
	v, ok := e.values[key]
	return v, ok
}

// put records the values of keys of a Secret at resourceVersion. A key
// missing from data is recorded as missing (a nil value), so that a
// reconcile of a relay whose key is missing does not read the Secret again.
func (c *secretCache) put(secret types.NamespacedName, resourceVersion string, data map[string][]byte, keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.secrets[secret]
	if !ok {
		e = &secretEntry{users: map[types.NamespacedName]struct{}{}}
		c.secrets[secret] = e
	}
	if e.resourceVersion != resourceVersion {
		e.resourceVersion = resourceVersion
		e.values = map[string][]byte{}
	}
	for _, k := range keys {
		e.values[k] = data[k]
	}
}

// drop forgets a Secret (it was deleted).
func (c *secretCache) drop(secret types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.secrets[secret]; ok {
		e.resourceVersion, e.values = "", nil
	}
}

// use records that relay references exactly these Secrets now; entries no
// relay references any more are dropped.
func (c *secretCache) use(relay types.NamespacedName, secrets ...types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range secrets {
		if e, ok := c.secrets[s]; ok {
			e.users[relay] = struct{}{}
		}
	}
	for _, old := range c.refs[relay] {
		if !containsName(secrets, old) {
			c.releaseLocked(relay, old)
		}
	}
	c.refs[relay] = append([]types.NamespacedName(nil), secrets...)
}

// forget drops what relay referenced.
func (c *secretCache) forget(relay types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.refs[relay] {
		c.releaseLocked(relay, s)
	}
	delete(c.refs, relay)
}

func (c *secretCache) releaseLocked(relay, secret types.NamespacedName) {
	e, ok := c.secrets[secret]
	if !ok {
		return
	}
	delete(e.users, relay)
	if len(e.users) == 0 {
		delete(c.secrets, secret)
	}
}

// len returns the number of Secrets cached, for tests.
func (c *secretCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.secrets)
}

func containsName(list []types.NamespacedName, n types.NamespacedName) bool {
	for _, x := range list {
		if x == n {
			return true
		}
	}
	return false
}
