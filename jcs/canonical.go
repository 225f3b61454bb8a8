package jcs

// Canonical is Canonicalize, except that input already in canonical form
// (CheckCanonical: one pass, no allocation) is returned itself rather than
// copied: outside input the kernel canonicalizes for its records
// (provenance, notes) usually arrives in that form. The caller must not
// modify data while it holds the result.
func Canonical(data []byte) ([]byte, error) {
	if CheckCanonical(data) == nil {
		return data, nil
	}
	return Canonicalize(data)
}
