/* Command-line parsing (see args.h). Accepts "--flag value" and "--flag=value". */
#include "app/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An optional value: metavar "[w1|w2|...]" lists the words the option may take; word is
 * one of them. */
static int is_word_of(const char *metavar, const char *word) {
  if (metavar == NULL || metavar[0] != '[') return 0;
  const size_t n = strlen(word);
  for (const char *p = metavar + 1; *p && *p != ']';) {
    const char *e = p;
    while (*e && *e != '|' && *e != ']') e++;
    if ((size_t)(e - p) == n && n > 0 && strncmp(p, word, n) == 0) return 1;
    p = *e == '|' ? e + 1 : e;
  }
  return 0;
}

static mp_opt *find(mp_cmd_spec *spec, const char *name, size_t len) {
  for (mp_opt *o = spec->opts; o && o->name; o++)
    if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
  return NULL;
}

mp_status mp_args_parse(mp_ctx *ctx, mp_cmd_spec *spec, int argc, char **argv, const char **pos,
                        int *n_pos, int *help) {
  *n_pos = 0;
  *help = 0;
  for (mp_opt *o = spec->opts; o && o->name; o++) o->value = NULL;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      *help = 1;
      continue;
    }
    if (a[0] == '-' && a[1] != '\0' && !(a[1] >= '0' && a[1] <= '9')) {
      const char *eq = strchr(a, '=');
      size_t len = eq ? (size_t)(eq - a) : strlen(a);
      mp_opt *o = find(spec, a, len);
      if (o == NULL)
        return mp_error(ctx, MP_ERR_USAGE, "unknown flag '%.*s'; see 'meshplan %s --help'",
                        (int)len, a, spec->name);
      if (o->metavar == NULL) {
        if (eq)
          return mp_error(ctx, MP_ERR_USAGE, "%s takes no value", o->name);
        o->value = "1";
      } else if (o->metavar[0] == '[') {
        /* a switch that may take one of its words: "--fp8", "--fp8 auto", "--fp8=off" */
        if (eq && !is_word_of(o->metavar, eq + 1))
          return mp_error(ctx, MP_ERR_USAGE, "%s '%s': expected one of %s", o->name, eq + 1, o->metavar);
        if (eq) o->value = eq + 1;
        else if (i + 1 < argc && is_word_of(o->metavar, argv[i + 1])) o->value = argv[++i];
        else o->value = "1";
      } else if (eq) {
        if (eq[1] == '\0')
          return mp_error(ctx, MP_ERR_USAGE, "%s needs a value (%s): %s", o->name, o->metavar,
                          o->help);
        o->value = eq + 1;
      } else {
        /* a metavar in quotes ('ARGS') takes a command line of its own: the next argument
         * even when it opens with "--" */
        if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] == '-' && o->metavar[0] != '\''))
          return mp_error(ctx, MP_ERR_USAGE, "%s needs a value (%s): %s", o->name, o->metavar,
                          o->help);
        o->value = argv[++i];
      }
      continue;
    }
    if (*n_pos >= spec->max_positional)
      return mp_error(ctx, MP_ERR_USAGE, "unexpected argument '%s'; see 'meshplan %s --help'", a,
                      spec->name);
    pos[(*n_pos)++] = a;
  }
  return MP_OK;
}

void mp_args_print_help(const mp_cmd_spec *spec, FILE *f) {
  fprintf(f, "usage: meshplan %s %s\n\n%s\n\noptions:\n", spec->name, spec->usage, spec->summary);
  for (const mp_opt *o = spec->opts; o && o->name; o++) {
    char left[160];
    snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "",
             o->metavar ? o->metavar : "");
    /* a flag wider than the column has its help on the next line, at the column */
    if (strlen(left) > 26) fprintf(f, "  %s\n  %-26s %s\n", left, "", o->help);
    else fprintf(f, "  %-26s %s\n", left, o->help);
  }
  fprintf(f, "  %-26s %s\n", "-h, --help", "show this help");
}

static const mp_opt *cfind(const mp_cmd_spec *spec, const char *name) {
  for (const mp_opt *o = spec->opts; o && o->name; o++)
    if (strcmp(o->name, name) == 0) return o;
  return NULL;
}

const char *mp_args_get(const mp_cmd_spec *spec, const char *name) {
  const mp_opt *o = cfind(spec, name);
  return o ? o->value : NULL;
}

int mp_args_has(const mp_cmd_spec *spec, const char *name) { return mp_args_get(spec, name) != NULL; }

mp_status mp_args_int(mp_ctx *ctx, const mp_cmd_spec *spec, const char *name, long long min,
                      long long max, long long *out) {
  const char *v = mp_args_get(spec, name);
  if (v == NULL) return MP_OK;
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < min || x > max)
    return mp_error(ctx, MP_ERR_USAGE, "%s '%s': expected an integer in %lld..%lld", name, v, min,
                    max);
  *out = x;
  return MP_OK;
}

mp_status mp_args_double(mp_ctx *ctx, const mp_cmd_spec *spec, const char *name, double lo,
                         double hi, mp_range_ends ends, double *out) {
  const char *v = mp_args_get(spec, name);
  if (v == NULL) return MP_OK;
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  /* strtod reads "nan", "inf" and hex floats: only a finite value within the range counts */
  int ok = end != v && *end == '\0' && errno == 0 && isfinite(x) &&
           (ends == MP_RANGE_OPEN_LO ? x > lo : x >= lo) && (ends == MP_RANGE_OPEN_HI ? x < hi : x <= hi);
  if (!ok) {
    char r[96];
    mp_range_f64_str(lo, hi, ends, r, sizeof r);
    return mp_error(ctx, MP_ERR_USAGE, "%s '%s': expected a number in %s", name, v, r);
  }
  *out = x;
  return MP_OK;
}
