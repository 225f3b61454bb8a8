package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// Server timeouts. A call may run for minutes (proc.exec, approvals), so
// the write timeout is long; reading a request is not allowed to be slow.
// The event streams (GET /v1/events, the console's) outlive writeTimeout:
// each sets its own deadline before every write.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 60 * time.Second
	writeTimeout      = 15 * time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
)

func serveCmd() *cobra.Command {
	var data, listen, cert, key, policyDir, pprofAddr string
	var drain time.Duration
	var cfg kernel.Config
	var tf telemetryFlags
	cmd := &cobra.Command{
		Use:   "serve --data DIR [--listen 127.0.0.1:7070]",
		Short: "Serve the kernel's HTTP API",
		Long: `serve opens the data dir (one server per data dir: a second one fails at once)
and serves the HTTP API. It listens on loopback by default; any other address
needs --tls-cert and --tls-key (PEM files, read before it listens: a wrong one
is a usage error, exit 2). It prints "serving <kernel id> on <URL>" when ready.

On SIGTERM or SIGINT it stops accepting, lets calls in flight finish (commit or
roll back) for up to --drain, then closes the database cleanly. A second signal,
or the end of --drain, exits at once: the next start rolls back or redoes every
transaction that was interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if data == "" {
				return &usageError{errors.New("serve: --data DIR is required")}
			}
			if (cert == "") != (key == "") {
				return &usageError{errors.New("serve: give both --tls-cert and --tls-key, or neither")}
			}
			if err := checkListen("--listen", listen, cert != "", "serving it needs --tls-cert and --tls-key"); err != nil {
				return &usageError{err}
			}
			if pprofAddr != "" {
				if err := checkListen("--pprof", pprofAddr, false, "the profiler is served on loopback only"); err != nil {
					return &usageError{err}
				}
			}
			if err := tf.check(); err != nil {
				return &usageError{err}
			}
			// The key pair is loaded before anything listens, so that a
			// wrong file fails serve before its ready line.
			var pair *tls.Certificate
			if cert != "" {
				p, err := loadKeyPair(cert, key)
				if err != nil {
					return err
				}
				pair = &p
			}
			// --policy is relative to the working directory (kernel.json's
			// policy_dir is relative to the data dir, and a wrong one is
			// named here, where loading it would say "stat .").
			pd, err := bundleDir("--policy", policyDir)
			if err == nil && pd == "" {
				pd, err = kernel.PolicyDir(data)
			}
			if err != nil {
				return err
			}
			cfg.DataDir, cfg.PolicyDir = data, pd
			tel, err := tf.setup(cmd, &cfg)
			if err != nil {
				return err
			}
			defer tel.close()
			return serve(cmd, cfg, tel, listen, pair, pprofAddr, drain)
		},
	}
	cmd.Flags().StringVar(&data, "data", os.Getenv("CAPKERNEL_DATA"), "kernel data dir (env CAPKERNEL_DATA)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7070", "address to listen on (port 0 picks a free one)")
	cmd.Flags().StringVar(&cert, "tls-cert", "", "TLS certificate file (PEM); required off loopback")
	cmd.Flags().StringVar(&key, "tls-key", "", "TLS private key file (PEM)")
	cmd.Flags().StringVar(&pprofAddr, "pprof", "", "also serve Go's profiler (net/http/pprof, /debug/pprof/) on this loopback address")
	cmd.Flags().StringVar(&policyDir, "policy", "", "policy bundle dir replacing the data dir's (default: kernel.json's, else the embedded bundle)")
	cmd.Flags().DurationVar(&drain, "drain", 30*time.Second, "how long to let calls in flight finish on SIGTERM")
	cmd.Flags().DurationVar(&cfg.ApprovalTimeout, "approval-timeout", kernel.DefaultApprovalTimeout, "how long a soft_gate or escalated call waits for a decision")
	cmd.Flags().DurationVar(&cfg.ApprovalValidity, "approval-validity", kernel.DefaultApprovalValidity, "how long an allowed approval stays good for its call")
	cmd.Flags().IntVar(&cfg.SessionConcurrency, "session-concurrency", kernel.DefaultSessionLimit, "calls of one session executing at once")
	cmd.Flags().IntVar(&cfg.SessionQueue, "session-queue", kernel.DefaultSessionQueue, "calls of one session waiting in line before more are refused")
	cmd.Flags().DurationVar(&cfg.CancelGrace, "cancel-grace", kernel.DefaultCancelGrace, "how long a cancelled syscall may take to stop before it is abandoned")
	tf.register(cmd)
	return cmd
}

// checkListen refuses for flag a non-loopback address (unless tls); the
// error says what flag supports, in offLoopback.
func checkListen(flag, addr string, tls bool, offLoopback string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT, e.g. 127.0.0.1:7070: %v", flag, addr, err)
	}
	if tls || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s %s is not a loopback address: %s", flag, addr, offLoopback)
}

// serverGCPercent is the GC target of kernelctl serve and mcp unless GOGC
// is set. A call's garbage is small and short-lived and the live heap of a
// kernel is a few MiB, so collecting at 4× the live heap instead of 2×
// trades some resident memory for a third or so less CPU per call
// (docs/benchmarks.md, section "Memory held under 200 clients").
const serverGCPercent = 400

// useServerGC sets serverGCPercent unless GOGC is set.
func useServerGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(serverGCPercent)
	}
}

// loadKeyPair reads the certificate of --tls-cert and the key of
// --tls-key; its errors name the flag and the file that is wrong, and are
// usage errors, as a missing --policy dir is.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, usagef("--tls-cert %s: %v", certFile, unwrapPath(err))
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, usagef("--tls-key %s: %v", keyFile, unwrapPath(err))
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, usagef("--tls-cert %s with --tls-key %s: %v", certFile, keyFile, err)
	}
	return pair, nil
}

// serve serves cfg's kernel on listen, over TLS with pair unless it is nil.
func serve(cmd *cobra.Command, cfg kernel.Config, tel *serverTelemetry, listen string, pair *tls.Certificate, pprofAddr string, drain time.Duration) error {
	useServerGC()
	// Signals are caught before the kernel opens, so none is lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	k, err := kernel.Open(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		k.Close()
		return fmt.Errorf("serve: %w", err)
	}
	ctl, err := httpapi.ServeControl(k, cfg.DataDir)
	if err != nil {
		ln.Close()
		k.Close()
		return fmt.Errorf("serve: %w", err)
	}
	api := httpapi.New(k)
	tel.attach(k, api)
	srv := &http.Server{
		Handler:           api,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	// Each connection is a descriptor of the kernel's process: a bound
	// keeps descriptors for the kernel's own files.
	maxConns := httpapi.MaxConns()
	ln = httpapi.LimitConns(srv, ln, maxConns)
	// On shutdown, event streams end and calls waiting for an approval
	// give up, so that only calls doing work hold the drain.
	srv.RegisterOnShutdown(k.Drain)
	scheme := "http"
	if pair != nil {
		scheme = "https"
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*pair}}
	}
	if pprofAddr != "" {
		pln, err := net.Listen("tcp", pprofAddr)
		if err != nil {
			ln.Close()
			ctl.Close()
			k.Close()
			return fmt.Errorf("serve: --pprof: %w", err)
		}
		defer pln.Close()
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		go http.Serve(pln, mux)
		fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: profiler on http://%s/debug/pprof/\n", pln.Addr())
	}
	fmt.Fprintf(cmd.OutOrStdout(), "serving %s on %s://%s (policy %s)\n", k.ID(), scheme, ln.Addr(), k.PolicyHash())
	fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: control socket %s: kernelctl verbs given --data %s reach this kernel through it\n", ctl.Path(), cfg.DataDir)
	tel.log.Info("serving", "kernel_id", k.ID(), "url", scheme+"://"+ln.Addr().String(), "policy_hash", k.PolicyHash(), "max_conns", maxConns)
	served := make(chan error, 1)
	go func() {
		if pair != nil {
			// The certificate is srv.TLSConfig's, loaded already.
			served <- srv.ServeTLS(ln, "", "")
		} else {
			served <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-served:
		ctl.Close()
		tel.log.Error("serving failed", "error", err)
		k.Close()
		return fmt.Errorf("serve: %w", err)
	case <-k.Failed():
		return failStopped(cmd, tel, k, srv, ctl)
	case sig := <-sigs:
		fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: %s: draining calls in flight (up to %s)\n", sig, drain)
		tel.log.Info("draining", "signal", sig.String(), "drain", drain.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	go func() {
		select {
		case sig := <-sigs:
			fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: second %s: exiting now; the next start recovers interrupted calls\n", sig)
			tel.log.Warn("exiting without draining", "signal", sig.String())
			os.Exit(1)
		case <-ctx.Done():
		}
	}()
	if err := errors.Join(srv.Shutdown(ctx), ctl.Shutdown(ctx), k.WaitBackground(ctx)); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: calls still running after %s: exiting; the next start recovers them\n", drain)
		tel.log.Warn("exiting with calls still running", "drain", drain.String(), "error", err)
		os.Exit(1)
	}
	ferr := k.Err() // a durability failure while draining
	if err := k.Close(); err != nil {
		tel.log.Error("closing the kernel", "error", err)
		return fmt.Errorf("serve: closing the kernel: %w", err)
	}
	if ferr != nil {
		return fmt.Errorf("serve: durability failure while draining: %w", ferr)
	}
	tel.log.Info("stopped")
	fmt.Fprintln(cmd.ErrOrStderr(), "kernelctl: stopped cleanly")
	return nil
}

// failAnswerTime bounds how long a fail-stopped server keeps its
// connections to answer the calls caught in the failure (internal, outcome
// unknown) before it exits.
const failAnswerTime = 2 * time.Second

// failStopped ends a server whose kernel failed stop (a durability
// failure: see kernel.Kernel.Failed): it stops accepting, gives the calls in
// flight a moment to get their internal answers, closes the kernel without
// writing and returns the failure, so that kernelctl exits non-zero and
// its supervisor restarts it; the next start recovers from what is durable.
func failStopped(cmd *cobra.Command, tel *serverTelemetry, k *kernel.Kernel, srv *http.Server, ctl interface{ Shutdown(context.Context) error }) error {
	ferr := k.Err()
	fmt.Fprintf(cmd.ErrOrStderr(), "kernelctl: durability failure: %v\nkernelctl: exiting; restart to recover\n", ferr)
	tel.log.Error("exiting on a durability failure", "error", ferr.Error())
	ctx, cancel := context.WithTimeout(context.Background(), failAnswerTime)
	defer cancel()
	srv.Shutdown(ctx)
	ctl.Shutdown(ctx)
	k.Close()
	return fmt.Errorf("serve: durability failure: %w", ferr)
}
