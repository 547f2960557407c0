# Nsight Compute on the KDA family's two preparation launches (block rows, solve) at the headline, with the
# per-SASS-instruction source counters that map stall samples to Python lines (session 12's method: line the
# profiled SASS up with `tools/sass_kda.py --dump`'s, instruction for instruction).
#   KDA_DEV_NCU_KNOBS='{...}' bash tools/ncu_prep.sh      # on the H200, after device_setup.sh; files to $OUT
set -u
out=${OUT:-/tmp/ncu_out}
mkdir -p "$out"
ncu --profile-from-start off --clock-control none --target-processes all -k "regex:${NCU_REGEX:-_kda_prep_kernel}" --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SourceCounters --import-source no \
  -f -o "$out/prep_ncu" python3 tools/dev_kda_chunked.py --ncu
ncu --import "$out/prep_ncu.ncu-rep" --page details --csv > "$out/prep_details.csv"
ncu --import "$out/prep_ncu.ncu-rep" --page source --csv --print-source sass > "$out/prep_source_sass.csv"
gzip -f "$out/prep_source_sass.csv"
rm -f "$out/prep_ncu.ncu-rep"
