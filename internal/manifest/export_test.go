package manifest

import (
	"io"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// DecodeGeneral decodes r as Decode does, but converts every YAML document with
// YAMLToJSONStrict, never through the fast subset, so that tests can hold the two to the
// same objects and the same errors.
func DecodeGeneral(r io.Reader) ([]*nimbusv1.Object, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return decodeBytes(data, &decoder{general: true})
}
