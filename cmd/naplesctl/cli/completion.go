package cli

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Limits of shell completion.
const (
	// completionTimeout bounds how long completing an object or node name waits for
	// nimbus: past it, nothing is offered rather than the shell hanging.
	completionTimeout = 3 * time.Second
)

// objectArgs are the commands whose arguments are KIND and names of objects in nimbus,
// with how many names each takes; -1 is any number.
var objectArgs = map[string]int{"get": 1, "describe": 1, "delete": -1, "wait": -1}

// kindArgs are the commands whose first argument is a KIND and that take no object
// names from nimbus: explain, and delphi's commands.
var kindArgs = []string{"explain", "delphi list", "delphi get", "delphi watch"}

// nodeFlags are the flags whose values are node names.
var nodeFlags = []string{"node", "nodes"}

// addCompletions teaches shell completion (cobra's completion command, and the hidden
// __complete command its scripts call) naplesctl's arguments and flag values: kinds, in
// lower case, singular, plural and short; object names, asked from nimbus, of the kind given
// before them; node names (Node objects) for --node and --nodes; and the values of
// --output. What cannot be asked, when nimbus is unreachable or slow, completes to
// nothing, silently.
func (c *cli) addCompletions(root *cobra.Command) {
	for _, cmd := range root.Commands() {
		if n, ok := objectArgs[cmd.Name()]; ok {
			cmd.ValidArgsFunction = c.completeObjects(n)
		}
		if slices.Contains(kindArgs, cmd.Name()) {
			cmd.ValidArgsFunction = completeKindOnly
		}
		for _, sub := range cmd.Commands() {
			if slices.Contains(kindArgs, cmd.Name()+" "+sub.Name()) {
				sub.ValidArgsFunction = completeKindOnly
			}
		}
	}
	c.addFlagCompletions(root)
}

// addFlagCompletions registers the completion of node flags and --output on cmd and every
// command under it.
func (c *cli) addFlagCompletions(cmd *cobra.Command) {
	for _, name := range nodeFlags {
		if cmd.Flags().Lookup(name) != nil {
			_ = cmd.RegisterFlagCompletionFunc(name, c.completeNodes)
		}
	}
	if f := cmd.Flags().Lookup("output"); f != nil {
		_ = cmd.RegisterFlagCompletionFunc(f.Name, completeOutput(outputChoices(cmd, f.Usage)))
	}
	for _, sub := range cmd.Commands() {
		c.addFlagCompletions(sub)
	}
}

// completeObjects returns the completion of KIND and then up to names object names (any
// number when names is -1) of that kind, those already given left out.
func (c *cli) completeObjects(names int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return completeKindOnly(cmd, args, toComplete)
		}
		if names >= 0 && len(args) > names {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		kind, err := nimbusv1.ParseKind(args[0])
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		tenant, namespace := flagValue(cmd, "tenant"), flagValue(cmd, "namespace")
		return withPrefix(c.objectNames(cmd.Context(), kind, tenant, namespace, args[1:]), toComplete, false),
			cobra.ShellCompDirectiveNoFileComp
	}
}

// completeKindOnly completes the first argument with kind names and nothing after it.
func completeKindOnly(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return withPrefix(kindSpellings(), toComplete, true), cobra.ShellCompDirectiveNoFileComp
}

// completeNodes completes a node flag with the names of the Node objects.
func (c *cli) completeNodes(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	// --nodes takes a comma-separated list: complete its last entry.
	done, last := "", toComplete
	if i := strings.LastIndexByte(toComplete, ','); i >= 0 {
		done, last = toComplete[:i+1], toComplete[i+1:]
	}
	var out []cobra.Completion
	for _, n := range withPrefix(c.objectNames(cmd.Context(), nimbusv1.Kind_KIND_NODE, "", "", nil), last, false) {
		out = append(out, done+n)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeOutput returns the completion of --output with values; a value that takes a
// template after its "=" is completed without a space after it.
func completeOutput(values []string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		out := withPrefix(values, toComplete, false)
		directive := cobra.ShellCompDirectiveNoFileComp
		if len(out) == 1 && strings.HasSuffix(out[0], "=") {
			directive |= cobra.ShellCompDirectiveNoSpace
		}
		return out, directive
	}
}

// outputChoices returns the values of cmd's --output flag, whose usage is usage: get's,
// or those the usage lists up to a semicolon, without what parentheses hold ("output
// format: table, json or yaml", "output format: wide (with ...) or name (...); ...").
func outputChoices(cmd *cobra.Command, usage string) []string {
	if cmd.Name() == "get" && cmd.Parent() != nil && !cmd.Parent().HasParent() {
		return outputValues
	}
	_, list, ok := strings.Cut(usage, "output format: ")
	if !ok {
		return nil
	}
	list, _, _ = strings.Cut(list, ";")
	list = parenthesized.ReplaceAllString(list, "")
	return strings.FieldsFunc(strings.ReplaceAll(list, " or ", ", "), func(r rune) bool { return r == ',' || r == ' ' })
}

// parenthesized matches what parentheses hold in a flag's usage, with them.
var parenthesized = regexp.MustCompile(`\([^)]*\)`)

// objectNames returns the names of the objects of kind in nimbus, in tenant and namespace
// when they are set, sorted and without duplicates, but those in given; nothing when
// nimbus cannot be asked.
func (c *cli) objectNames(ctx context.Context, kind nimbusv1.Kind, tenant, namespace string, given []string) []string {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	sess, err := c.connect()
	if err != nil {
		return nil
	}
	defer sess.Close()
	resp, err := nimbusv1.ListAll(ctx, sess.nimbus, &nimbusv1.ListRequest{Kind: kind, Tenant: tenant, Namespace: namespace})
	if err != nil {
		return nil
	}
	var names []string
	for _, it := range resp.GetItems() {
		if n := it.GetObject().GetMeta().GetName(); !slices.Contains(given, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// kindSpellings returns every kind's names as ParseKind takes them, in lower case:
// singular, plural and short ("route", "routes", "rt").
func kindSpellings() []string {
	var out []string
	for _, k := range nimbusv1.Kinds() {
		out = append(out, kindArg(k), k.Plural(), k.ShortName())
	}
	return out
}

// withPrefix returns the values that start with prefix, in either case when fold is set.
func withPrefix(values []string, prefix string, fold bool) []cobra.Completion {
	var out []cobra.Completion
	for _, v := range values {
		if strings.HasPrefix(v, prefix) || (fold && strings.HasPrefix(v, strings.ToLower(prefix))) {
			out = append(out, v)
		}
	}
	return out
}

// flagValue returns the value of cmd's flag name, or "" when it has none.
func flagValue(cmd *cobra.Command, name string) string {
	if f := cmd.Flags().Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
