package hal

import (
	"context"
	"errors"

	"github.com/naplesnet/naples/delphi"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// delphiStore is a delphi store as the HAL sees it.
type delphiStore struct {
	*delphi.Store
	status *delphi.StatusWriter
}

var _ Store = (*delphiStore)(nil)

// Delphi adapts a delphi store to Store. It claims the store's status writer: the HAL is
// the status table's one writer.
func Delphi(s *delphi.Store) (Store, error) {
	status, err := s.ClaimStatus()
	if err != nil {
		return nil, err
	}
	return &delphiStore{Store: s, status: status}, nil
}

func (d *delphiStore) Keys(kind nimbusv1.Kind) []string { return d.KeyIDs(kind) }

func (d *delphiStore) WatchDesired() (Feed, error) {
	sub, err := d.Subscribe(delphi.SubscribeOptions{Tables: []delphi.Table{delphi.TableDesired}})
	if errors.Is(err, delphi.ErrClosed) {
		return nil, errors.Join(ErrClosed, err)
	}
	if err != nil {
		return nil, err
	}
	return delphiFeed{sub}, nil
}

// WriteStatus records the statuses in one delphi transaction.
func (d *delphiStore) WriteStatus(updates []StatusUpdate) error {
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
		return errors.Join(ErrClosed, err)
	}
	return err
}

// delphiFeed is a delphi subscription whose end reads as ErrClosed.
type delphiFeed struct{ *delphi.Subscription }

func (f delphiFeed) Next(ctx context.Context) ([]string, error) {
	ids, err := f.Subscription.Next(ctx)
	if errors.Is(err, delphi.ErrClosed) {
		return nil, errors.Join(ErrClosed, err)
	}
	return ids, err
}
