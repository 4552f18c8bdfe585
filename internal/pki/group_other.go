//go:build !unix

package pki

import "os"

// setGroupOf does nothing where files have no unix group.
func setGroupOf(*os.File, os.FileInfo) error { return nil }
