// Package halstore adapts a delphi store to hal.Store, so that hal does not import
// delphi: the agent wires the two together through it.
package halstore

import (
	"context"
	"errors"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// delphiStore is a delphi store as the HAL sees it. The agent wires the two together, so
// that hal does not import delphi.
type delphiStore struct {
	*delphi.Store
	status *delphi.StatusWriter
}

var _ hal.Store = (*delphiStore)(nil)

// New adapts a delphi store to hal.Store. It claims the store's status writer:
// the HAL is the status table's one writer.
func New(s *delphi.Store) (hal.Store, error) {
	status, err := s.ClaimStatus()
	if err != nil {
		return nil, err
	}
	return &delphiStore{Store: s, status: status}, nil
}

func (d *delphiStore) WatchDesired() (hal.Feed, error) {
	sub, err := d.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableDesired}})
	if errors.Is(err, delphi.ErrClosed) {
		return nil, errors.Join(hal.ErrClosed, err)
	}
	if err != nil {
		return nil, err
	}
	return delphiFeed{sub}, nil
}

// WriteStatus records the statuses in one delphi transaction.
func (d *delphiStore) WriteStatus(updates []hal.StatusUpdate) error {
	txn := &delphi.StatusTxn{}
	for _, u := range updates {
		if u.Status == nil {
			txn.Delete(u.Key)
		} else {
			txn.SetOwned(u.Key, u.Status)
		}
	}
	err := d.status.Commit(txn)
	if errors.Is(err, delphi.ErrClosed) {
		return errors.Join(hal.ErrClosed, err)
	}
	return err
}

// delphiFeed is a delphi subscription whose end reads as hal.ErrClosed.
type delphiFeed struct{ *delphi.Subscription }

func (f delphiFeed) Next(ctx context.Context) ([]nimbusv1.Key, error) {
	ids, err := f.Subscription.Next(ctx)
	if errors.Is(err, delphi.ErrClosed) {
		return nil, errors.Join(hal.ErrClosed, err)
	}
	return ids, err
}
