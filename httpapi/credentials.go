package httpapi

import (
	"net/http"
	"strings"

	"github.com/capkernel/capkernel/kernel"
)

// Credential errors say what is wrong with what was sent, and what to send
// instead: the endpoints are for people at a terminal as much as for
// programs.

// msgWrongAdmin answers an admin credential that is not this kernel's.
const msgWrongAdmin = "the admin credential is wrong: it has the form of one but is not this kernel's " +
	"(the kernel's is the content of admin.token in its data dir)"

// notAdmin says what a bearer credential that is not of the admin
// credential's form is instead.
func notAdmin(cred string) string {
	switch {
	case strings.Count(cred, ".") == 2:
		return "a capability token cannot use admin endpoints: send the admin credential (the content of admin.token in the kernel's data dir)"
	case strings.ContainsAny(cred, "/\\") || strings.HasSuffix(cred, ".token"):
		return "the bearer credential looks like a file path; send the credential itself (the file's content), not its path"
	}
	return "the bearer credential is not an admin credential (one starts with " + kernel.AdminPrefix + "; it is the content of admin.token in the kernel's data dir)"
}

// writeAdminRefusal answers a request to an admin endpoint whose bearer
// credential cred is not this kernel's admin credential.
func writeAdminRefusal(w http.ResponseWriter, cred string) {
	switch {
	case cred == "":
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, "this endpoint needs the admin credential as a bearer token (Authorization: Bearer "+kernel.AdminPrefix+"…, the content of admin.token in the kernel's data dir)")
	case !strings.HasPrefix(cred, kernel.AdminPrefix):
		writeError(w, http.StatusForbidden, kernel.ErrPermissionDenied, notAdmin(cred))
	default:
		writeError(w, http.StatusUnauthorized, kernel.ErrTokenInvalid, msgWrongAdmin)
	}
}
