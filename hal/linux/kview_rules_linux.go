package linux

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// ruleTable is a KernelView's table of the IPv4 and IPv6 policy-routing rules that a
// ruleKey identifies whole (`ip rule show`): those that select packets by their input
// interface or their whole firewall mark alone (ruleMsg.plain), holding each rule's
// protocol. A rule with other selectors is not in it: its key would not tell it from
// another.
type ruleTable struct {
	*viewTable[ruleKey, uint8]
	// byIIF finds the rules of an input interface by its name.
	byIIF *hal.Index[ruleKey, uint8, string]
}

// newRuleTable returns an empty rule table.
func newRuleTable() *ruleTable {
	t := &ruleTable{viewTable: newViewTable(viewTableOptions[ruleKey, uint8]{
		groups: []uint{unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE},
		equal:  func(have, want uint8) bool { return have == want },
		fields: func(a, b uint8) uint64 {
			if a != b {
				return 1
			}
			return 0
		},
		notify: notifyRule,
		dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[ruleKey, uint8]) error {
			_, err := dumpMirror(ctx, c, m, "rules", unix.RTM_NEWRULE, parsePlainRule, rtnl.RuleDumpRequest())
			return err
		},
	})}
	t.byIIF = hal.NewIndex(t.m, func(k ruleKey, _ uint8) (string, bool) { return k.iif, k.iif != "" })
	return t
}

// get returns the protocol of the rule with the key.
func (t *ruleTable) get(k ruleKey) (uint8, bool) { return t.m.Get(k) }

// parsePlainRule decodes the payload of an RTM_NEWRULE or RTM_DELRULE message
// (parseRuleMsg) into the rule's key and protocol, if the table holds rules like it.
func parsePlainRule(b []byte) (ruleKey, uint8, bool) {
	m, ok := parseRuleMsg(b)
	return m.key, m.protocol, ok && m.plain
}

// notifyRule applies a rule notification, an RTM_NEWRULE or RTM_DELRULE, to the
// table's mirror.
func notifyRule(m *hal.Mirror[ruleKey, uint8], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWRULE && typ != unix.RTM_DELRULE {
		return
	}
	k, proto, ok := parsePlainRule(payload)
	switch {
	case !ok:
	case typ == unix.RTM_NEWRULE:
		m.Update(k, proto)
	default:
		m.Remove(k)
	}
}
