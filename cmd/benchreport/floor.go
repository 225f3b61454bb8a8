package main

// The floor of a durable call over HTTP: what any server that answers a
// call only once a record of it is on disk must spend, measured beside
// the kernel and OPA in section 1–2 so that the kernel's distance from
// OPA splits into what durability costs on this machine and what
// governance adds to it.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"time"

	"go.etcd.io/bbolt"
)

// floorTarget names the floor server in section 1–2.
const floorTarget = "floor: HTTP + a group-committed bbolt put"

// floorMaxBatch bounds one group commit of the floor server, as
// store.MaxBatch bounds the kernel's.
const floorMaxBatch = 256

// floorPut is one request's record, waiting for its group commit.
type floorPut struct {
	body []byte
	done chan error
}

// serveFloor is the floor server process (benchreport -serve-floor DIR
// -floor-answer FILE): POST / reads the request body, puts it in the bbolt
// file DIR/floor.db under the next sequence number, and answers the bytes
// of FILE (the kernel's own answer to the same fs.read) once that put is
// durable. Puts are group committed as the kernel's store commits: one
// goroutine takes every put queued while the last transaction committed
// into the next (one fdatasync'd bbolt transaction, the options the
// kernel's store opens its file with). No token, policy, syscall, hash,
// signature or receipt: the least a server that audits durably can do.
// It prints its URL and serves until stdin closes.
func serveFloor(dir, answerFile string) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as kernelctl serve
	}
	answer, err := os.ReadFile(answerFile)
	if err != nil {
		return err
	}
	db, err := bbolt.Open(filepath.Join(dir, "floor.db"), 0o600, &bbolt.Options{
		NoFreelistSync: true, FreelistType: bbolt.FreelistMapType, InitialMmapSize: 1 << 30,
	})
	if err != nil {
		return err
	}
	defer db.Close()
	queue := make(chan floorPut, floorMaxBatch)
	go floorCommits(db, queue)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p := floorPut{body: body, done: make(chan error, 1)}
		queue <- p
		if err := <-p.done; err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{strconv.Itoa(len(answer))}
		w.Write(answer)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	fmt.Printf("http://%s\n", ln.Addr())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// floorCommits commits the puts of queue in groups: the first waiting,
// then every one queued behind it, in one transaction.
func floorCommits(db *bbolt.DB, queue <-chan floorPut) {
	batch := make([]floorPut, 0, floorMaxBatch)
	for first := range queue {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < floorMaxBatch {
			select {
			case p := <-queue:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		err := db.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("calls"))
			if err != nil {
				return err
			}
			b.FillPercent = 1 // appended in key order, as the kernel's ledger
			for _, p := range batch {
				seq, _ := b.NextSequence()
				if err := b.Put(binary.BigEndian.AppendUint64(nil, seq), p.body); err != nil {
					return err
				}
			}
			return nil
		})
		for _, p := range batch {
			p.done <- err
		}
	}
}

// startFloor runs this program as the floor server on dir, answering
// answer, and reads its URL.
func startFloor(dir string, answer []byte) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	answerFile := filepath.Join(dir, "answer.json")
	if err := os.WriteFile(answerFile, answer, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-serve-floor", dir, "-floor-answer", answerFile)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // held open until stop: the server serves until it closes
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || len(line) < len("http://") {
		p.stop()
		return nil, fmt.Errorf("benchreport -serve-floor: no ready line (%q, %v)", line, err)
	}
	p.url = line[:len(line)-1]
	return p, nil
}
