package captoken

import (
	"hash/maphash"
	"sync"
)

// cacheShards spreads the cache over independently locked maps so that
// concurrent calls rarely wait for each other.
const cacheShards = 16

// sigCache maps a raw token (or, over maxTokenKey bytes, its digest) to
// its signature-checked, well-formed Claims and its digest. Keying by the
// whole token, or its digest, means an entry is only ever found for the
// exact bytes that were verified; a hit on a token of usual size hashes
// it with maphash only (a digest of each call's token would cost a BLAKE3
// of a kilobyte).
// Each shard holds a bounded number of entries; when one is full, adding
// drops an arbitrary entry (Go randomises map iteration order).
type sigCache struct {
	seed   maphash.Seed
	max    int // entries per shard
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string]verified
}

// verified is a cached token's claims and digest.
type verified struct {
	claims Claims
	hash   string
}

// newSigCache returns a cache of about size entries, or nil (no caching)
// if size < 0.
func newSigCache(size int) *sigCache {
	if size < 0 {
		return nil
	}
	c := &sigCache{seed: maphash.MakeSeed(), max: max(1, size/cacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]verified)
	}
	return c
}

func (c *sigCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// get returns what is cached for the token key. A nil cache holds nothing.
func (c *sigCache) get(key string) (verified, bool) {
	if c == nil {
		return verified{}, false
	}
	s := c.shard(key)
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.m[key]
	return v, ok
}

// put caches v under key. A nil cache drops it.
func (c *sigCache) put(key string, v verified) {
	if c == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; !ok && len(s.m) >= c.max {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[key] = v
}
