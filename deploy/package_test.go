package deploy

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// packageVersion is the version the package test builds its packages with, which the
// installed binaries must print.
const packageVersion = "0.0.0-pkgtest"

// packagedUnits are the systemd units the packages install.
var packagedUnits = []string{
	"/usr/lib/systemd/system/nimbus.service",
	"/usr/lib/systemd/system/naples-agent.service",
}

// TestPackageInstalls builds the packages of this machine's architecture with `make
// package`, installs the .deb with dpkg, runs the three installed binaries, verifies the
// installed units with systemd-analyze, and checks that the .rpm holds the same files. It
// purges the package again, so the machine is left as found.
func TestPackageInstalls(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "" {
			t.Skip("installing a package needs root")
		}
		t.Fatal("installing a package needs root, and CI is set")
	}
	for _, tool := range []string{"make", "dpkg", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	if out, err := exec.Command("dpkg-query", "-W", "naples").CombinedOutput(); err == nil {
		t.Fatalf("package naples is already installed (%s); the test installs and purges it", strings.TrimSpace(string(out)))
	}

	dist := t.TempDir()
	run(t, "make", "-C", moduleRoot, "--no-print-directory", "package", "VERSION="+packageVersion, "DIST="+dist)
	debs, _ := filepath.Glob(filepath.Join(dist, "pkg", "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(dist, "pkg", "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("make package built debs %q and rpms %q, want one of each", debs, rpms)
	}

	hadUser := exec.Command("getent", "passwd", "naples").Run() == nil
	t.Cleanup(func() {
		if out, err := exec.Command("dpkg", "--purge", "naples").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge naples: %v\n%s", err, out)
		}
		// The package leaves the user it made, as packages do; the test does not.
		if !hadUser {
			if out, err := exec.Command("userdel", "naples").CombinedOutput(); err != nil {
				t.Errorf("userdel naples: %v\n%s", err, out)
			}
			exec.Command("groupdel", "naples").Run() // gone with the user where userdel removes it
		}
	})
	run(t, "dpkg", "-i", debs[0])

	// The package's script made the user nimbus runs as.
	if fields := strings.Split(strings.TrimSpace(run(t, "getent", "passwd", "naples")), ":"); len(fields) != 7 || fields[5] != "/var/lib/naples/nimbus" {
		t.Errorf("user naples after installing: %q, want one with home /var/lib/naples/nimbus", fields)
	}
	run(t, "getent", "group", "naples")

	for _, cmd := range []string{"naples-agent", "nimbus", "naplesctl"} {
		out := run(t, "/usr/bin/"+cmd, "--version")
		if !strings.HasPrefix(out, cmd+" "+packageVersion+" ") {
			t.Errorf("/usr/bin/%s --version printed %q, want %q first", cmd, out, cmd+" "+packageVersion)
		}
	}
	for _, unit := range packagedUnits {
		for _, exe := range execStartPaths(t, unit) {
			if _, err := os.Stat(exe); err != nil {
				t.Errorf("unit %s starts %s: %v", unit, exe, err)
			}
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Errorf("systemd-analyze: %v", err)
	} else {
		verifyUnits(t, packagedUnits...)
	}
	for _, path := range []string{
		"/usr/lib/sysusers.d/naples.conf", "/etc/default/nimbus", "/etc/default/naples-agent",
		"/usr/share/naples/grafana/naples.json", "/usr/share/doc/naples/LICENSE",
		"/usr/share/doc/naples/README.md", "/usr/share/doc/naples/deploy/README.md",
		"/usr/share/doc/naples/docs/ui.md", "/usr/share/doc/naples/docs/ui-matrix.png",
	} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("installed package: %v", err)
		}
	}
	if out := run(t, "dpkg-query", "--showformat=${Conffiles}", "-W", "naples"); !strings.Contains(out, "/etc/default/nimbus") ||
		!strings.Contains(out, "/etc/default/naples-agent") {
		t.Errorf("package conffiles %q, want /etc/default/nimbus and /etc/default/naples-agent", out)
	}

	if _, err := exec.LookPath("rpm"); err != nil {
		t.Errorf("rpm: %v (the .rpm's file list is unchecked)", err)
		return
	}
	if scripts := run(t, "rpm", "-qp", "--scripts", rpms[0]); !strings.Contains(scripts, "systemd-sysusers naples.conf") ||
		!strings.Contains(scripts, "systemctl disable --now nimbus.service") {
		t.Errorf("the .rpm's scripts do not make the user and stop the units on removal:\n%s", scripts)
	}
	rpmFiles := strings.Fields(run(t, "rpm", "-qpl", rpms[0]))
	for _, path := range strings.Fields(run(t, "dpkg-query", "-L", "naples")) {
		if fi, err := os.Stat(path); err == nil && !fi.IsDir() && !slices.Contains(rpmFiles, path) {
			t.Errorf("the .deb installs %s, the .rpm %s does not hold it", path, filepath.Base(rpms[0]))
		}
	}
	for _, path := range rpmFiles {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the .rpm holds %s, the .deb did not install it: %v", path, err)
		}
	}
}

// run runs name with args, fails the test when it fails, and returns its standard output.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// olderSystemdKeys are the unit settings systemd 254 introduced: an older systemd-analyze
// warns that it does not know them, as deploy/README.md says, and is otherwise content.
var olderSystemdKeys = []string{"RestartSteps", "RestartMaxDelaySec"}

// verifyUnits runs `systemd-analyze verify` on the unit files and fails the test when it
// fails or warns (unitProblems).
func verifyUnits(t *testing.T, units ...string) {
	t.Helper()
	problems, err := unitProblems(units...)
	if err != nil {
		t.Errorf("%v", err)
	}
	for _, p := range problems {
		t.Errorf("systemd-analyze verify: %s", p)
	}
}

// unitProblems runs `systemd-analyze verify` on the unit files and returns the lines it
// printed but those about olderSystemdKeys, and an error when it failed. It exits 0 on a
// misspelt setting or a value it cannot parse, which it only prints ("Unknown key ...",
// "Failed to parse ..."), so its exit status alone passes such units.
func unitProblems(units ...string) ([]string, error) {
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("systemd-analyze verify %s: %w\n%s", strings.Join(units, " "), err, out)
	}
	var problems []string
	for line := range strings.Lines(string(out)) {
		if line = strings.TrimSpace(line); line != "" && !olderSystemdWarning(line) {
			problems = append(problems, line)
		}
	}
	return problems, nil
}

// olderSystemdWarning reports whether line is an older systemd's warning about one of
// olderSystemdKeys.
func olderSystemdWarning(line string) bool {
	for _, key := range olderSystemdKeys {
		if strings.HasSuffix(line, "Unknown key '"+key+"' in section [Service], ignoring.") {
			return true
		}
	}
	return false
}

// execStartPaths returns the executables the ExecStart= and ExecStartPre= lines of the
// unit file start, without the prefixes systemd allows before them ("+", "-", ...).
func execStartPaths(t *testing.T, unit string) []string {
	t.Helper()
	f, err := os.Open(unit)
	if err != nil {
		t.Fatalf("unit %s: %v", unit, err)
	}
	defer f.Close()
	var paths []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || (key != "ExecStart" && key != "ExecStartPre") {
			continue
		}
		if fields := strings.Fields(strings.TrimLeft(value, "+-@:!")); len(fields) > 0 {
			paths = append(paths, fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("unit %s: %v", unit, err)
	}
	if len(paths) == 0 {
		t.Fatalf("unit %s has no ExecStart=", unit)
	}
	return paths
}

// TestUnitsVerify runs `systemd-analyze verify` on the units of systemd/, with their
// binaries, which only the package installs, replaced by /bin/true: it must print
// nothing but an older systemd's warnings about olderSystemdKeys. A copy with a misspelt
// setting and a value systemd cannot parse must be reported, or the check could not
// fail.
func TestUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("systemd-analyze is not installed")
		}
		t.Fatalf("systemd-analyze: %v, and CI is set", err)
	}
	units, err := filepath.Glob("systemd/*.service")
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in systemd/ (%v)", err)
	}
	dir := t.TempDir()
	var copies []string
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "ExecStart=/usr/bin/", "ExecStart=/bin/true /usr/bin/")
		if text == string(b) {
			t.Fatalf("unit %s has no ExecStart=/usr/bin/...", unit)
		}
		copies = append(copies, filepath.Join(dir, filepath.Base(unit)))
		if err := os.WriteFile(copies[len(copies)-1], []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	verifyUnits(t, copies...)

	b, err := os.ReadFile(copies[0])
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(strings.Replace(string(b), "\nRestart=", "\nRestrat=", 1), "\nProtectSystem=strict", "\nProtectSystem=strcit", 1)
	badUnit := filepath.Join(t.TempDir(), filepath.Base(copies[0]))
	if err := os.WriteFile(badUnit, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	problems, err := unitProblems(badUnit)
	if err != nil {
		t.Fatal(err)
	}
	if text := strings.Join(problems, "\n"); !strings.Contains(text, "Restrat") || !strings.Contains(text, "strcit") {
		t.Errorf("systemd-analyze verify of a unit with Restrat= and ProtectSystem=strcit reported %q, want both", problems)
	}
}

// docLink matches a Markdown link or image and captures its target.
var docLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestPackagedDocsLinksResolve reads what nfpm.yaml installs and checks that every
// relative link and image of the Markdown files it installs names a file it installs
// too, so that the docs read on an installed machine lead somewhere.
func TestPackagedDocsLinksResolve(t *testing.T) {
	b, err := os.ReadFile("nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Contents []struct{ Src, Dst string }
	}
	if err := yaml.Unmarshal(b, &config); err != nil {
		t.Fatalf("nfpm.yaml: %v", err)
	}
	installed := map[string]string{} // installed path: its source file
	for _, c := range config.Contents {
		if strings.Contains(c.Src, "${") {
			continue // the binaries, which the Makefile names
		}
		srcs, err := filepath.Glob(filepath.Join(moduleRoot, c.Src))
		if err != nil || len(srcs) == 0 {
			t.Fatalf("nfpm.yaml: src %q matches no file (%v)", c.Src, err)
		}
		for _, src := range srcs {
			dst := c.Dst
			if strings.HasSuffix(dst, "/") {
				dst = path.Join(dst, filepath.Base(src))
			}
			installed[dst] = src
		}
	}
	docs := 0
	for dst, src := range installed {
		if path.Ext(dst) != ".md" {
			continue
		}
		docs++
		text, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docLink.FindAllStringSubmatch(string(text), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, ok := installed[path.Join(path.Dir(dst), target)]; !ok {
				t.Errorf("%s (from %s) links to %s, which the package does not install at %s", dst, src, m[1], path.Join(path.Dir(dst), target))
			}
		}
	}
	if docs < 3 {
		t.Errorf("nfpm.yaml installs %d Markdown files, want README.md, deploy/README.md and docs/", docs)
	}
}
