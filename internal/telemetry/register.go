package telemetry

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers every collector with reg, all or none, and returns the function
// that unregisters them again. owner names what the collectors belong to (a "Store", a
// "Server"), for the error when reg already has them: another owner of the same kind
// shares the Registerer.
func Register(reg prometheus.Registerer, owner string, cs ...prometheus.Collector) (unregister func(), err error) {
	var done []prometheus.Collector
	unregister = func() {
		for _, c := range done {
			reg.Unregister(c)
		}
		done = nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			unregister()
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				err = fmt.Errorf("%w (is another %s using the same Registerer?)", err, owner)
			}
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
		done = append(done, c)
	}
	return unregister, nil
}
