# Checks meshplan validate's output (its table and per-metric summary) against bands:
#   expected  file of "case predicted" lines (# comments): each row's prediction must stay
#             within 1 % of the recorded one, and every recorded row must be printed
#   pub_band  when > 0, each row's error against its published figure must stay within
#             +-pub_band percent
#   limits    "metric:mape_max:tau_min,..." per metric: the MAPE ceiling (%) and the Kendall
#             tau floor, each metric's summary line required
#   min_rows  the fewest table rows accepted
# Prints one FAIL line per failure and a summary; exits non-zero on any failure.
BEGIN {
  while ((getline line < expected) > 0) {
    if (line ~ /^#/) continue
    split(line, f, " ")
    want[f[1]] = f[2]
  }
  n = split(limits, lim, ",")
  for (i = 1; i <= n; i++) {
    split(lim[i], p, ":")
    mape_max[p[1]] = p[2] + 0; tau_min[p[1]] = p[3] + 0
  }
  fails = 0; rows = 0
}
NF == 6 && $1 != "case" {
  rows++
  name = $1; pred = $4 + 0; pub = $5 + 0; err = $6; sub(/%/, "", err)
  if (!(name in want)) { printf "FAIL: row %s has no expected prediction\n", name; fails++; next }
  seen[name] = 1
  d = (pred - want[name]) / want[name]
  if (d > 0.01 || d < -0.01) {
    printf "FAIL: %s predicted %g, recorded %g (%+.2f%%)\n", name, pred, want[name], 100 * d
    fails++
  }
  if (pub_band > 0 && (err + 0 > pub_band || err + 0 < -pub_band)) {
    printf "FAIL: %s is %s%% off its published figure\n", name, err; fails++
  }
}
$1 in mape_max && NF >= 4 && $2 ~ /^[0-9]+$/ {
  m = $3; sub(/%/, "", m)
  if (m + 0 > mape_max[$1]) { printf "FAIL: %s MAPE %s%% over %.1f%%\n", $1, m, mape_max[$1]; fails++ }
  if ($4 == "n/a" || $4 + 0 < tau_min[$1]) { printf "FAIL: %s Kendall tau %s under %.2f\n", $1, $4, tau_min[$1]; fails++ }
  checked[$1] = 1
}
END {
  for (k in want) if (!(k in seen)) { printf "FAIL: expected row %s not printed\n", k; fails++ }
  for (k in mape_max) if (!(k in checked)) { printf "FAIL: no summary line for %s\n", k; fails++ }
  if (rows < min_rows) { printf "FAIL: only %d rows\n", rows; fails++ }
  printf "%s: %d rows, %d failures\n", label, rows, fails
  exit fails > 0
}
