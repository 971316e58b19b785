/* prom.c: the Prometheus text format writer (see prom.h). */
#include "ops/prom.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_escaped(agw_buf_t *b, const char *s, size_t len, int quotes)
{
    if (len == (size_t)-1)
        len = strlen(s);
    agw_buf_reserve(b, len);
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '\\')
            agw_buf_puts(b, "\\\\");
        else if (c == '\n')
            agw_buf_puts(b, "\\n");
        else if (c == '"' && quotes)
            agw_buf_puts(b, "\\\"");
        else
            agw_buf_putc(b, c);
    }
}

void agw_prom_escape_label(agw_buf_t *b, const char *s, size_t len)
{
    put_escaped(b, s, len, 1);
}

void agw_prom_family(agw_buf_t *b, const char *name, const char *type, const char *help)
{
    agw_buf_printf(b, "# HELP %s ", name);
    put_escaped(b, help, (size_t)-1, 0);
    agw_buf_printf(b, "\n# TYPE %s %s\n", name, type);
}

void agw_prom_value(agw_buf_t *b, double v)
{
    if (isnan(v)) {
        agw_buf_puts(b, "NaN");
    } else if (isinf(v)) {
        agw_buf_puts(b, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        agw_buf_printf(b, "%.0f", v);
    } else {
        char tmp[40];
        snprintf(tmp, sizeof(tmp), "%.15g", v);
        if (strtod(tmp, NULL) != v)
            snprintf(tmp, sizeof(tmp), "%.17g", v);
        agw_buf_puts(b, tmp);
    }
}

static void put_labels(agw_buf_t *b, const agw_prom_label_t *labels, size_t n, const char *le, double le_value)
{
    if (n == 0 && le == NULL)
        return;
    agw_buf_putc(b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i)
            agw_buf_putc(b, ',');
        agw_buf_puts(b, labels[i].name);
        agw_buf_puts(b, "=\"");
        put_escaped(b, labels[i].value ? labels[i].value : "", labels[i].value ? labels[i].value_len : 0, 1);
        agw_buf_putc(b, '"');
    }
    if (le) {
        if (n)
            agw_buf_putc(b, ',');
        agw_buf_puts(b, "le=\"");
        agw_prom_value(b, le_value);
        agw_buf_putc(b, '"');
    }
    agw_buf_putc(b, '}');
}

void agw_prom_sample_u64(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                         uint64_t value)
{
    agw_buf_puts(b, name);
    put_labels(b, labels, num_labels, NULL, 0);
    agw_buf_printf(b, " %" PRIu64 "\n", value);
}

void agw_prom_sample(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                     double value)
{
    agw_buf_puts(b, name);
    put_labels(b, labels, num_labels, NULL, 0);
    agw_buf_putc(b, ' ');
    agw_prom_value(b, value);
    agw_buf_putc(b, '\n');
}

void agw_prom_histogram(agw_buf_t *b, const char *name, const agw_prom_label_t *labels, size_t num_labels,
                        const double *bounds, size_t num_bounds, double divisor, const uint64_t *counts, double sum)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= num_bounds; i++) {
        cum += counts[i];
        agw_buf_printf(b, "%s_bucket", name);
        put_labels(b, labels, num_labels, "le", i < num_bounds ? bounds[i] / divisor : INFINITY);
        agw_buf_printf(b, " %" PRIu64 "\n", cum);
    }
    agw_buf_printf(b, "%s_sum", name);
    put_labels(b, labels, num_labels, NULL, 0);
    agw_buf_putc(b, ' ');
    agw_prom_value(b, sum);
    agw_buf_printf(b, "\n%s_count", name);
    put_labels(b, labels, num_labels, NULL, 0);
    agw_buf_printf(b, " %" PRIu64 "\n", cum);
}
