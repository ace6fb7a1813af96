# bench/lib.sh: what the bench scripts share (sourced, not run).
# nrs_stats FMT: the median, minimum and maximum of the numbers on stdin, one
# per line, each printed with the printf format FMT ("n/a n/a n/a" if none).
nrs_stats() { sort -g | awk -v f="$1" '{v[NR] = $1} END {
    if (!NR) { print "n/a n/a n/a"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf f " " f " " f "\n", m, v[1], v[NR] }'; }
