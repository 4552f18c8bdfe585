// Command printversion prints version.String, for the test that sets the version with the
// linker's -X flag as `make release` does.
package main

import (
	"fmt"

	"github.com/naplesnet/naples/internal/version"
)

func main() {
	fmt.Println(version.String("printversion"))
}
