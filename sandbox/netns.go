package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// A root kernel's spare chain starts in a network namespace of its own
// (unshare --net, off the run's path), with its loopback interface set up
// here: bwrap then runs without --unshare-net, whose new namespace and
// loopback setup cost ~0.5–0.8 ms on the run's path (measured on the
// 2-core machine). The namespace holds only the loopback interface, as
// bwrap's would; it belongs to the chain's user namespace, of which the
// sandbox's processes, in a user namespace bwrap nests in it with every
// capability dropped, hold no capability. A run with the full network
// posture never takes such a chain (takeSpareChain).

// loopbackIndex is the loopback interface's index in every network
// namespace: the first device the namespace is made with.
const loopbackIndex = 1

// loopbackUp sets the loopback interface of pid's network namespace up,
// as bwrap does in the namespace --unshare-net makes (the kernel gives it
// 127.0.0.1 and ::1 then). It needs CAP_SYS_ADMIN over that namespace and
// its own (a root kernel's).
func loopbackUp(pid int) error {
	fd, err := netlinkIn(pid)
	if err != nil {
		return fmt.Errorf("sandbox: loopback of pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	// A spare chain waits for the answer: never for ever.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return fmt.Errorf("sandbox: loopback of pid %d: %w", pid, err)
	}
	// RTM_NEWLINK: struct nlmsghdr, struct ifinfomsg.
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.RTM_NEWLINK)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(msg[8:], 1) // sequence number
	info := msg[unix.SizeofNlMsghdr:]
	ne.PutUint32(info[4:], loopbackIndex)
	ne.PutUint32(info[8:], unix.IFF_UP)  // flags
	ne.PutUint32(info[12:], unix.IFF_UP) // change
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sandbox: loopback of pid %d: %w", pid, err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("sandbox: loopback of pid %d: %w", pid, err)
	}
	// The answer is an NLMSG_ERROR: its error, 0 for the acknowledgement.
	if n < unix.SizeofNlMsghdr+4 || ne.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("sandbox: loopback of pid %d: unexpected netlink answer", pid)
	}
	if e := int32(ne.Uint32(buf[unix.SizeofNlMsghdr:])); e != 0 {
		return fmt.Errorf("sandbox: loopback of pid %d: %w", pid, unix.Errno(-e))
	}
	return nil
}

// netlinkIn returns a route netlink socket of pid's network namespace: a
// socket belongs to the namespace it was made in, so a thread enters it,
// makes the socket and returns to its own. A thread that cannot return
// ends with its goroutine, never running anything else.
func netlinkIn(pid int) (int, error) {
	target, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(target)
	type made struct {
		fd  int
		err error
	}
	ch := make(chan made, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- made{-1, err}
			return
		}
		defer unix.Close(own)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- made{-1, fmt.Errorf("entering its network namespace: %w", err)}
			return
		}
		fd, sockErr := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err := unix.Setns(own, unix.CLONE_NEWNET); err != nil {
			// Still locked: the thread ends with this goroutine.
			if sockErr == nil {
				unix.Close(fd)
			}
			ch <- made{-1, errors.New("leaving its network namespace: " + err.Error())}
			return
		}
		runtime.UnlockOSThread()
		ch <- made{fd, sockErr}
	}()
	m := <-ch
	return m.fd, m.err
}
