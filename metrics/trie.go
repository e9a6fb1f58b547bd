package metrics

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
)

// linearMax is the most children a trie node scans linearly before switching to a map.
const linearMax = 8

// trie is a copy-on-write map from a tuple of label values to a value, one level per label.
// get is lock-free (one atomic load, then short linear scans or map lookups, no allocation);
// insert copies only the nodes along the path and must be serialised by the caller.
type trie[T any] struct {
	root atomic.Pointer[tnode[T]]
}

// tnode is one level: children by the next value, in a short slice scanned linearly or, once
// there are more than linearMax, in a map.
type tnode[T any] struct {
	keys []string
	kids []*tnode[T]
	next map[string]*tnode[T]
	val  T
	has  bool // val is set (leaf)
}

func (n *tnode[T]) child(v string) *tnode[T] {
	if n.next != nil {
		return n.next[v]
	}
	for i := range n.keys {
		if n.keys[i] == v {
			return n.kids[i]
		}
	}
	return nil
}

// get returns the value stored for lvs.
func (t *trie[T]) get(lvs []string) (T, bool) {
	n := t.root.Load()
	for i := 0; n != nil && i < len(lvs); i++ {
		n = n.child(lvs[i])
	}
	if n == nil || !n.has {
		var zero T
		return zero, false
	}
	return n.val, true
}

// insert stores v for lvs (keys are cloned). Callers serialise inserts.
func (t *trie[T]) insert(lvs []string, v T) {
	t.root.Store(withPath(t.root.Load(), lvs, v))
}

// withPath returns a copy of n (which may be nil) with the path lvs leading to v.
func withPath[T any](n *tnode[T], lvs []string, v T) *tnode[T] {
	if n == nil {
		n = &tnode[T]{}
	}
	c := &tnode[T]{keys: n.keys, kids: n.kids, next: n.next, val: n.val, has: n.has}
	if len(lvs) == 0 {
		c.val, c.has = v, true
		return c
	}
	key := lvs[0]
	kid := withPath(n.child(key), lvs[1:], v)
	switch {
	case n.next != nil:
		c.next = maps.Clone(n.next)
	case n.child(key) == nil && len(n.keys) >= linearMax:
		c.keys, c.kids = nil, nil
		c.next = make(map[string]*tnode[T], len(n.keys)+1)
		for i, k := range n.keys {
			c.next[k] = n.kids[i]
		}
	default:
		c.keys, c.kids = slices.Clone(n.keys), slices.Clone(n.kids)
		if i := slices.Index(c.keys, key); i >= 0 {
			c.kids[i] = kid
		} else {
			c.keys = append(c.keys, strings.Clone(key))
			c.kids = append(c.kids, kid)
		}
		return c
	}
	if _, ok := c.next[key]; !ok {
		key = strings.Clone(key)
	}
	c.next[key] = kid
	return c
}
