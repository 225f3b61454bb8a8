package tracing

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// batcher is the Provider's span processor. Like the SDK's batch span
// processor it queues sampled spans, up to a limit past which it drops
// them, and exports them in batches from one goroutine when a batch is
// full or a delay has passed. Unlike it, it takes a call's spans in one
// step under one lock, where the SDK's hands each span over a channel
// to its goroutine, waking that goroutine span by span: at a busy
// kernel's rate that hand-off cost more than making the spans did. Its
// goroutine wakes only for a full batch or the delay, and it reports
// dropped spans to the OpenTelemetry error handler (see LogErrors)
// instead of only counting them.
type batcher struct {
	exp sdktrace.SpanExporter
	cfg batchConfig

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	dropped int // since the last report
	stopped bool

	exportMu sync.Mutex              // one export at a time
	spare    []sdktrace.ReadOnlySpan // the queue exported last, reused

	wake     chan struct{} // a full batch waits; capacity 1
	stop     chan struct{} // closed by Shutdown
	loopDone chan struct{} // closed when the loop has exported the last spans
	once     sync.Once
}

// batchConfig is a batcher's configuration.
type batchConfig struct {
	queue   int           // spans queued at most
	batch   int           // spans exported per request at most
	delay   time.Duration // longest time a span waits for a batch to fill
	timeout time.Duration // longest an export may take
}

// Defaults of batchConfig. The specification's queue of 2048 spans
// holds about 300 calls, which a busy kernel makes in a tenth of a
// second, and every call's spans are meant to reach the collector: the
// queue is 16 times that. Its batch of 512 spans makes a request every
// 70 or so calls, whose fixed cost (HTTP on both sides, a 32 KB copy
// buffer in net/http) was a quarter of what tracing cost a call
// (BenchmarkCallDone: 7.9-9.2 cpu-µs per echo call with 512, 5.5-7.2
// with 2048); 2048 spans make requests of about 300 KB, far below what
// collectors accept (the OpenTelemetry Collector: 20 MiB by default).
// The delay and timeout are the specification's.
const (
	defaultQueue   = 32768
	defaultBatch   = 2048
	defaultDelay   = 5 * time.Second
	defaultTimeout = 30 * time.Second
)

// batchConfigFromEnv reads OTEL_BSP_MAX_QUEUE_SIZE,
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_SCHEDULE_DELAY and
// OTEL_BSP_EXPORT_TIMEOUT (milliseconds), as the specification has the
// batch span processor read them, through getenv. A value that is not a
// positive integer is an error. A batch larger than the queue is the
// queue.
func batchConfigFromEnv(getenv func(string) string) (batchConfig, error) {
	c := batchConfig{queue: defaultQueue, batch: defaultBatch, delay: defaultDelay, timeout: defaultTimeout}
	for _, v := range []struct {
		name string
		n    *int
		d    *time.Duration
	}{
		{"OTEL_BSP_MAX_QUEUE_SIZE", &c.queue, nil},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &c.batch, nil},
		{"OTEL_BSP_SCHEDULE_DELAY", nil, &c.delay},
		{"OTEL_BSP_EXPORT_TIMEOUT", nil, &c.timeout},
	} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("%s %q is not a positive integer", v.name, s)
		}
		if v.n != nil {
			*v.n = n
		} else {
			*v.d = time.Duration(n) * time.Millisecond
		}
	}
	c.batch = min(c.batch, c.queue)
	return c, nil
}

// newBatcher starts a batcher exporting to exp.
func newBatcher(exp sdktrace.SpanExporter, cfg batchConfig) *batcher {
	b := &batcher{exp: exp, cfg: cfg, wake: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{})}
	go b.loop()
	return b
}

// add queues spans, all sampled, or drops them all if they do not fit.
func (b *batcher) add(spans ...sdktrace.ReadOnlySpan) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	n := len(b.queue)
	if n+len(spans) > b.cfg.queue {
		b.dropped += len(spans)
		b.mu.Unlock()
		return
	}
	b.queue = append(b.queue, spans...)
	full := n < b.cfg.batch && len(b.queue) >= b.cfg.batch
	b.mu.Unlock()
	if full {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

// loop exports the queue when a batch is full or the delay is up, and
// all of it when the batcher stops.
func (b *batcher) loop() {
	defer close(b.loopDone)
	t := time.NewTimer(b.cfg.delay)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			b.export(context.Background())
			return
		case <-b.wake:
		case <-t.C:
		}
		b.export(context.Background())
		t.Reset(b.cfg.delay)
	}
}

// export exports every span queued now, in batches, and reports spans
// dropped since the last export. Errors go to the OpenTelemetry error
// handler, as the SDK's processor's do, unless ctx ends first: that
// error is returned.
func (b *batcher) export(ctx context.Context) error {
	b.exportMu.Lock()
	defer b.exportMu.Unlock()
	b.mu.Lock()
	q := b.queue
	b.queue = b.spare[:0]
	dropped := b.dropped
	b.dropped = 0
	b.mu.Unlock()
	if dropped > 0 {
		otel.Handle(fmt.Errorf("%d spans dropped: the export queue of %d spans was full", dropped, b.cfg.queue))
	}
	defer func() {
		clear(q) // let the spans go
		b.spare = q[:0]
	}()
	for len(q) > 0 {
		n := min(len(q), b.cfg.batch)
		ectx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
		err := b.exp.ExportSpans(ectx, q[:n])
		cancel()
		for _, s := range q[:n] {
			if r, ok := s.(interface{ release() }); ok {
				r.release() // exported or failed: the exporter is done with it
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			otel.Handle(err)
		}
		q = q[n:]
	}
	return nil
}

// OnStart implements sdktrace.SpanProcessor: nothing to do.
func (*batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd implements sdktrace.SpanProcessor: s is queued if it is sampled.
func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanContext().IsSampled() {
		b.add(s)
	}
}

// ForceFlush implements sdktrace.SpanProcessor: it exports every span
// queued, unless ctx ends first.
func (b *batcher) ForceFlush(ctx context.Context) error {
	return b.export(ctx)
}

// Shutdown implements sdktrace.SpanProcessor: it stops taking spans,
// exports those queued and shuts the exporter down, unless ctx ends
// first. Later calls do nothing.
func (b *batcher) Shutdown(ctx context.Context) error {
	var err error
	b.once.Do(func() {
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
		close(b.stop)
		select {
		case <-b.loopDone:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
		err = b.exp.Shutdown(ctx)
	})
	return err
}
