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

func (d *delphiStore) Keys(kind nimbusv1.Kind) []string {
	objs := d.List(kind)
	ids := make([]string, len(objs))
	for i, o := range objs {
		ids[i] = o.Key().ID()
	}
	return ids
}

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

func (d *delphiStore) SetStatus(key *nimbusv1.ObjectKey, st *nimbusv1.NodeStatus) error {
	return d.status.Set(key, st)
}

func (d *delphiStore) DeleteStatus(key *nimbusv1.ObjectKey) error { return d.status.Delete(key) }

// delphiFeed is a delphi subscription whose end reads as ErrClosed.
type delphiFeed struct{ *delphi.Subscription }

func (f delphiFeed) Next(ctx context.Context) ([]string, error) {
	ids, err := f.Subscription.Next(ctx)
	if errors.Is(err, delphi.ErrClosed) {
		return nil, errors.Join(ErrClosed, err)
	}
	return ids, err
}
