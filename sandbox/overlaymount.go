package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// mountOverlays mounts the overlay of each rw root (setupOverlay) in the
// chain's mount namespace, before bwrap has its options: nsenter(1) joins
// the chain's user and mount namespaces, as their root (the kernel's own
// ids), and execs mount(8), which mounts every line of an fstab written
// in the staging directory. No shell, two execs whatever the number of
// roots, and the mounts are made with the capabilities of the chain's user
// namespace only, never the host's. A refused mount is errOverlayRefused,
// with mount's message.
func mountOverlays(t *tools, c *chain, st *stageDir, rw []*rootPlan) error {
	if !c.mountNS {
		return errors.New("sandbox: overlays need a chain with a mount namespace of its own")
	}
	var b strings.Builder
	for _, r := range rw {
		// overlayPathOK has kept blanks, commas and colons out of these.
		fmt.Fprintf(&b, "overlay %s overlay lowerdir=%s,upperdir=%s,workdir=%s,%s 0 0\n", r.merged, r.lower, r.upper, r.work, overlayOptions)
	}
	fstab := filepath.Join(st.path, "fstab")
	if err := os.WriteFile(fstab, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("sandbox: staging: %w", err)
	}
	if err := nsenterMount(t, c, fstab, "overlay"); err != nil {
		return fmt.Errorf("%w: %v", errOverlayRefused, err)
	}
	return nil
}

// nsenterMount mounts every line of fstab of the given type in the
// chain's mount namespace: nsenter joins the chain's user and mount
// namespaces (as their root) and execs mount. An error holds mount's
// message.
func nsenterMount(t *tools, c *chain, fstab, types string) error {
	if err := c.waitExec(t); err != nil {
		return err
	}
	cmd := exec.Command(t.nsenter, "--target", strconv.Itoa(c.cmd.Process.Pid), "--user", "--mount", "--",
		t.mount, "--all", "--internal-only", "--fstab", fstab, "--types", types)
	cmd.Env = []string{"PATH=" + hostPath, "LC_ALL=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		if why := strings.TrimSpace(string(out)); why != "" {
			return errors.New(why)
		}
		return err
	}
	return nil
}

// waitExec waits until the chain runs bwrap, so unshare has made its
// namespaces and made its mount namespace private: a mount made there
// then stays there. A spare chain has long done so.
func (c *chain) waitExec(t *tools) error {
	comm := filepath.Base(t.bwrap)
	if len(comm) > 15 {
		comm = comm[:15] // the kernel keeps 15 bytes of a command's name
	}
	path := "/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/comm"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		if b, err := os.ReadFile(path); err == nil && strings.TrimSuffix(string(b), "\n") == comm {
			return nil
		}
		if c.exited() {
			return errors.New("sandbox: the chain ended before it ran bwrap")
		}
		if time.Now().After(deadline) {
			return errors.New("sandbox: the chain did not run bwrap within 10 s")
		}
	}
}
