package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/internal/exitstatus"
)

// manifestExts are the extensions, in any case, of the files that -f DIR reads.
var manifestExts = []string{".yaml", ".yml", ".json"}

// filenameUsage is the help of the -f flag of a command that reads manifests to what.
func filenameUsage(what string) string {
	return `manifest file ` + what + `, "-" for stdin, or a directory whose *.yaml, *.yml and *.json files are read in name order; repeatable`
}

// addRecursiveFlag adds -R, --recursive to cmd, a command that reads manifests with
// readManifests: a directory given to -f is then read with its subdirectories.
func (c *cli) addRecursiveFlag(cmd *cobra.Command) {
	cmd.Flags().BoolVarP(&c.recursive, "recursive", "R", false, "read the subdirectories of a directory given to -f too, each where its name falls among the files")
}

// manifestPaths returns the files that readManifests reads for the arguments of -f,
// in order: a file stays as it is, "-" stays for stdin, and a directory is replaced by
// its manifest files (manifestExts) in name order; with --recursive its subdirectories
// are read too, each in the place of its name, without following symbolic links below
// the directory. A directory that holds no manifest file, and stdin named twice, are
// usage errors, as a file that does not exist is.
func (c *cli) manifestPaths(files []string) ([]string, error) {
	paths := make([]string, 0, len(files))
	stdin := false
	for _, f := range files {
		if f == "-" {
			if stdin {
				return nil, exitstatus.Mark(errors.New(`-f "-": stdin is named twice`))
			}
			stdin = true
			paths = append(paths, f)
			continue
		}
		if fi, err := os.Stat(f); err != nil || !fi.IsDir() {
			// Reading the file reports what is wrong with it, naming it.
			paths = append(paths, f)
			continue
		}
		found, subdirs, err := dirManifests(f, c.recursive)
		if err != nil {
			return nil, fmt.Errorf("reading directory %s: %w", f, err)
		}
		if len(found) == 0 {
			hint := ""
			if subdirs && !c.recursive {
				hint = " (-R reads its subdirectories)"
			}
			return nil, exitstatus.Mark(fmt.Errorf("directory %s: no *.yaml, *.yml or *.json files%s", f, hint))
		}
		paths = append(paths, found...)
	}
	return paths, nil
}

// dirManifests returns the manifest files of dir in name order, and those of its
// subdirectories when recursive; subdirs tells whether dir has a subdirectory. A file is a
// manifest when its extension is one of manifestExts and it is, or links to, a regular
// file.
func dirManifests(dir string, recursive bool) (paths []string, subdirs bool, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err // names p
		}
		if d.IsDir() {
			if p == dir {
				return nil
			}
			subdirs = true
			if !recursive {
				return fs.SkipDir
			}
			return nil
		}
		if !slices.Contains(manifestExts, strings.ToLower(filepath.Ext(p))) {
			return nil
		}
		mode := d.Type()
		if mode&fs.ModeSymlink != 0 {
			fi, err := os.Stat(p)
			if err != nil {
				return err // names p
			}
			mode = fi.Mode()
		}
		if mode.IsRegular() {
			paths = append(paths, p)
		}
		return nil
	})
	return paths, subdirs, err
}
