// Package statefiletest writes bbolt files of any content, for tests of how state files
// that are damaged, old or foreign are read back.
package statefiletest

import (
	"testing"

	bolt "go.etcd.io/bbolt"
)

// Write creates a bbolt file at path holding the given buckets and values.
func Write(t testing.TB, path string, buckets map[string]map[string][]byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		for name, kv := range buckets {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := b.Put([]byte(k), v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
