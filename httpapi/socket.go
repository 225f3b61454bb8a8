package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// The control socket: every front end that runs a kernel in its own
// process (kernelctl serve, mcp --data, run --data) also serves this API
// on a Unix socket in the data dir, so that kernelctl verbs given --data
// reach the running kernel (to approve a call, follow events, mint a
// token) instead of finding its database locked.
//
// The file-system permission is the credential: the socket is mode 0600,
// owned by the kernel's user, in a data dir that is itself 0700, and the
// server also refuses a connection whose peer (SO_PEERCRED) is neither
// that user nor root. A request on the socket without an Authorization
// header acts with the admin's authority; one with a bearer credential
// (an approver or capability token) acts as that credential, exactly as
// over TCP.

// ControlSocket is the control socket's name in a data dir.
const ControlSocket = "control.sock"

// controlBase is the URL the control client addresses; the host is never
// resolved, the transport dials the socket.
const controlBase = "http://kernel"

// maxSocketPath is the longest path sun_path holds (108 bytes with the
// terminating NUL on Linux).
const maxSocketPath = 107

// Control is a kernel's API served on the control socket of its data dir.
type Control struct {
	path string
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// ServeControl serves the API of k, with the admin's authority for
// requests that carry no credential, on dir/control.sock. The caller
// must hold k open (k owns dir's database lock), so a socket file
// already there is a stale one of a kernel that died and is replaced.
// The socket is created under a temporary name, made 0600 and renamed
// into place, so it is never reachable with wider permissions. Close
// (or Shutdown) stops serving and removes the file.
func ServeControl(k *kernel.Kernel, dir string) (*Control, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	s := New(k)
	// A per-process admin credential that never leaves this process: the
	// handler below sends it for requests that carry none.
	s.local = kernel.AdminPrefix + "local_" + base64.RawURLEncoding.EncodeToString(secret)
	final := filepath.Join(dir, ControlSocket)
	tmp := filepath.Join(dir, ControlSocket+".tmp"+strconv.Itoa(os.Getpid()))
	_ = os.Remove(tmp)
	addr, release, err := socketAddr(tmp)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", addr)
	release()
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", final, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("control socket %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("control socket %s: %w", final, err)
	}
	c := &Control{path: final, ln: peerListener{ln.(*net.UnixListener)}, done: make(chan struct{})}
	c.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") == "" {
				r.Header.Set("Authorization", "Bearer "+s.local)
			}
			s.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		defer close(c.done)
		_ = c.srv.Serve(c.ln)
	}()
	return c, nil
}

// Path returns the socket's path.
func (c *Control) Path() string { return c.path }

// Shutdown stops accepting, waits (up to ctx) for requests in flight and
// removes the socket file. Event streams should be ended first
// (kernel.Drain), or they hold it until ctx ends.
func (c *Control) Shutdown(ctx context.Context) error {
	os.Remove(c.path)
	err := c.srv.Shutdown(ctx)
	<-c.done
	return err
}

// Close stops serving at once and removes the socket file.
func (c *Control) Close() error {
	os.Remove(c.path)
	err := c.srv.Close()
	<-c.done
	return err
}

// ControlClient returns a client of the kernel serving dir, reached
// through its control socket, and true; or nil and false when no kernel
// answers there (no socket, or a stale one). The client carries no
// credential: the socket grants the admin's authority. Set Credential
// to act as a token instead.
func ControlClient(dir string) (*Client, bool) {
	path := filepath.Join(dir, ControlSocket)
	if _, err := os.Lstat(path); err != nil {
		return nil, false
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		addr, release, err := socketAddr(path)
		if err != nil {
			return nil, err
		}
		defer release()
		var d net.Dialer
		return d.DialContext(ctx, "unix", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := dial(ctx)
	if err != nil {
		return nil, false
	}
	conn.Close()
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:    4,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{BaseURL: controlBase, HTTP: &http.Client{Transport: tr}}, true
}

// socketAddr returns an address for the socket at path that fits in
// sun_path: path itself, or, for a long one, the path through
// /proc/self/fd of its opened directory (held open until release).
func socketAddr(path string) (string, func(), error) {
	if len(path) <= maxSocketPath {
		return path, func() {}, nil
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", nil, err
	}
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path))
	if len(addr) > maxSocketPath {
		d.Close()
		return "", nil, fmt.Errorf("control socket %s: name too long", path)
	}
	return addr, func() { d.Close() }, nil
}

// peerListener accepts only connections from this process's user or
// root: a second check behind the socket file's mode.
type peerListener struct{ *net.UnixListener }

func (l peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if err := checkPeer(c); err != nil {
			c.Close()
			continue
		}
		return c, nil
	}
}

// errForeignPeer refuses a peer of another user.
var errForeignPeer = errors.New("control socket: peer is another user")

func checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Uid != uint32(os.Getuid()) && cred.Uid != 0 {
		return errForeignPeer
	}
	return nil
}

// isAdmin reports whether cred is the admin credential of the kernel, or
// the control socket's own per-process one.
func (s *Server) isAdmin(cred string) bool {
	if s.local != "" && subtle.ConstantTimeCompare([]byte(cred), []byte(s.local)) == 1 {
		return true
	}
	return s.k.IsAdmin(cred)
}
