/* prom.h: writing the Prometheus text exposition format, version 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/).
 *
 * A family starts with agw_prom_family() (its # HELP and # TYPE lines), then its samples follow,
 * one line each: name{label="value",…} value. Label values are escaped (backslash, double quote,
 * line feed), HELP text too (backslash, line feed). Histograms are written from non-cumulative
 * bucket counts: agw_prom_histogram() adds them up into the _bucket{le=…}, _sum and _count lines.
 * Nothing here allocates except the output buffer.
 */
#ifndef AGW_PROM_H
#define AGW_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* One label: name (a valid label name, written as is) and value (escaped); value_len may be
 * (size_t)-1 for a NUL-terminated value. */
typedef struct agw_prom_label {
    const char *name;
    const char *value;
    size_t value_len;
} agw_prom_label_t;

#define AGW_PROM_LABEL(n, v) ((agw_prom_label_t){(n), (v), (size_t)-1})

/* Writes "# HELP name help" and "# TYPE name type" (type: counter, gauge, histogram, untyped). */
void agw_prom_family(agw_buf_t *b, const char *name, const char *type, const char *help);

/* Appends s escaped as a label value (without the quotes). */
void agw_prom_escape_label(agw_buf_t *b, const char *s, size_t len);

/* Appends a sample value: integers without a fraction, +Inf, -Inf, NaN, otherwise the shortest
 * of %.15g / %.17g that reads back to the same double. */
void agw_prom_value(agw_buf_t *b, double v);

/* name[suffix]{labels} value, for an integer (counters) or a double. */
void agw_prom_sample_u64(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                         uint64_t value);
void agw_prom_sample(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                     double value);

/* A histogram's samples: bounds are the num_bounds upper bounds in ascending order (written as
 * le="…" divided by divisor, e.g. 1000 to write ms bounds as seconds); counts holds num_bounds + 1
 * non-cumulative counts (the last one is above every bound: the +Inf bucket); sum is written as is. */
void agw_prom_histogram(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                        const double *bounds, size_t num_bounds, double divisor, const uint64_t *counts, double sum);

#endif
