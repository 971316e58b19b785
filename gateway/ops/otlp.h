/* otlp.h: the span exporter: OTLP/HTTP with the JSON encoding, off the request path.
 *
 * Workers hand finished request traces (trace.h) to the exporter through one single-producer,
 * single-consumer ring each: a submit is two atomic loads and a store, never a lock or a system
 * call, and a full ring refuses the trace (the spans are counted as dropped, the request goes on).
 * The exporter thread wakes every AGW_OTLP_FLUSH_MS, takes what the rings hold and POSTs it to the
 * collector in batches of up to AGW_OTLP_BATCH_SPANS spans with a blocking client bounded by the
 * configured timeout (connect, send and the status line together). A refused, slow, failing (any
 * status but 2xx) or closing collector costs only the spans of that batch, counted as dropped; it
 * never slows a request. No retries: a trace is diagnostics, and a retry would only queue more.
 *
 * The document (OTLP 1.x, opentelemetry/proto/collector/trace/v1, JSON mapping): one resourceSpans
 * with service.name, one scopeSpans (scope "aggway"), every span with lowercase hex traceId, spanId
 * and parentSpanId, startTimeUnixNano and endTimeUnixNano as decimal strings, kind as the enum's
 * integer (2 SERVER for the gateway's span, 3 CLIENT for an upstream attempt), attributes as
 * { key, value: { stringValue | intValue (decimal string) | boolValue } }, and status { code:
 * 0 unset, 1 ok, 2 error, message }.
 */
#ifndef AGW_OTLP_H
#define AGW_OTLP_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "ops/trace.h"

struct agw_config;
struct agw_metric_labels;

#define AGW_OTLP_QUEUE 1024        /* traces waiting per worker; a full ring drops */
#define AGW_OTLP_FLUSH_MS 200      /* how often the exporter thread sends what is queued, ms */
#define AGW_OTLP_BATCH_SPANS 1024  /* spans per POST at most */

typedef struct agw_otlp agw_otlp_t;
typedef struct agw_otlp_queue agw_otlp_queue_t;

/* Starts the exporter thread for conf's tracing block (conf->otlp_* set; conf must outlive it) with
 * one ring per worker; route and upstream names come from names (the metric label registry, which
 * must outlive it too: traces hold label slots). Returns NULL (logged) when the thread cannot
 * start. */
agw_otlp_t *agw_otlp_start(const struct agw_config *conf, const struct agw_metric_labels *names,
                           size_t num_workers);

/* The ring of worker i (< num_workers); valid until agw_otlp_stop. */
agw_otlp_queue_t *agw_otlp_queue(agw_otlp_t *e, size_t i);

/* Hands tr to the exporter (worker thread, never blocks). Returns 0 when taken (the exporter frees
 * it with free()), or -1 when the ring is full: tr stays the caller's and its spans are counted as
 * dropped. */
int agw_otlp_submit(agw_otlp_queue_t *q, agw_trace_t *tr);

/* Stops the thread: an export in progress gives up at once, then one last export of what is
 * queued (bounded by the timeout, so shutdown waits at most timeout_ms for the collector); frees e
 * and every trace still in it. NULL is ignored. */
void agw_otlp_stop(agw_otlp_t *e);

/* Appends the exporter's Prometheus families to b: aggway_trace_spans_exported_total,
 * aggway_trace_spans_dropped_total{reason="queue_full"|"export_failed"},
 * aggway_trace_exports_total{result="ok"|"error"}. With e NULL (no collector configured) the
 * families are present with zero values. Thread-safe (relaxed atomic reads). */
void agw_otlp_render_metrics(agw_buf_t *b, const agw_otlp_t *e);

/* Encodes traces[0..n) as one OTLP/JSON ExportTraceServiceRequest into b (the gateway's span and
 * its children per trace); the service name comes from conf, route and upstream names from names
 * (the traces' label slots). Exposed for tests. */
void agw_otlp_encode(agw_buf_t *b, const struct agw_config *conf, const struct agw_metric_labels *names,
                     agw_trace_t *const *traces, size_t n);

/* Counts the spans of a trace as the exporter sends them: the gateway's span plus its children. */
size_t agw_otlp_trace_spans(const agw_trace_t *tr);

#endif
