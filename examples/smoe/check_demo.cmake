# Runs ssr-smoe-demo in a tiny configuration and checks its table, CSV and SVG files.
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${DEMO}" --steps 20 --seeds 2 --routers softmax,sigmoid+bias,ssr-l --momentum 0.5 --out "${OUT}"
  --json "${OUT}/results.json"
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "ssr-smoe-demo exited with ${status}:\n${out}\n${err}")
endif()
foreach(row IN ITEMS "| router | val bits/byte | attacked | no capacity |" "| softmax | " "| sigmoid+bias | "
                    "| ssr-l | " "Mean output norm" "| router | layer 0 | layer 1 |" "expert capacity factor 1;"
                    "Momentum SMoE, mu = 0.5" "Paired against softmax: the mean difference over 2 seeds of 20 steps"
                    "| router | val bits/byte | attacked | load max/mean, validation | dropped %, validation |")
  string(FIND "${out}" "${row}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the table has no row '${row}':\n${out}")
  endif()
endforeach()
string(FIND "${err}" "ssr-l         seed 1  step    20/20" at)
if(at EQUAL -1)
  message(FATAL_ERROR "no final progress line on stderr:\n${err}")
endif()

file(STRINGS "${OUT}/steps.csv" lines)
list(LENGTH lines count)
if(NOT count EQUAL 121)  # header + 3 routers x 2 seeds x 20 steps
  message(FATAL_ERROR "steps.csv has ${count} lines, expected 121")
endif()
list(GET lines 0 header)
if(NOT header MATCHES "^router,seed,step,train_bits_per_byte,aux_loss,load_max_over_mean,load_cv,empty_experts,dropped,")
  message(FATAL_ERROR "steps.csv header: ${header}")
endif()
list(GET lines 120 last)
if(NOT last MATCHES "^ssr-l,1,19,[0-9.]+,")
  message(FATAL_ERROR "steps.csv last line: ${last}")
endif()

# load.svg: every router; loss.svg: each router's difference to softmax top-k, with its band over the seeds.
foreach(chart IN ITEMS load loss)
  file(READ "${OUT}/${chart}.svg" svg)
  if(chart STREQUAL "load")
    set(parts ">softmax</text>" ">sigmoid+bias</text>" "<polyline ")
  else()
    set(parts "Training loss minus softmax top-k's" "band: 95% interval over 2 seeds" "<polygon " ">ssr-l</text>")
  endif()
  foreach(part IN ITEMS "<svg " ${parts} "</svg>")
    string(FIND "${svg}" "${part}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${chart}.svg has no '${part}'")
    endif()
  endforeach()
endforeach()
# The JSON: each router's values per seed, and each paired difference's interval around its mean.
file(READ "${OUT}/results.json" json)
string(JSON seeds GET "${json}" seeds)
string(JSON bpb_length LENGTH "${json}" routers ssr-l bpb)
string(JSON mean GET "${json}" paired softmax ssr-l bpb mean)
string(JSON low GET "${json}" paired softmax ssr-l bpb low)
string(JSON high GET "${json}" paired softmax ssr-l bpb high)
if(NOT seeds EQUAL 2 OR NOT bpb_length EQUAL 2 OR NOT (low LESS mean AND mean LESS high))
  message(FATAL_ERROR "results.json: seeds ${seeds}, ${bpb_length} values, interval ${low} < ${mean} < ${high}?")
endif()

# Without an attack the attacked metric is null, not 0; a file name with a quote and a backslash stays JSON.
set(odd "${OUT}/we\"ird\\name.txt")
string(REPEAT "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " 60 text)
file(WRITE "${odd}" "${text}")
execute_process(COMMAND "${DEMO}" --steps 2 --seeds 2 --routers softmax,ssr-l --attack 0 --data "${odd}"
  --out "${OUT}/odd" --json "${OUT}/odd/results.json" RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "ssr-smoe-demo --attack 0 --data '${odd}' exited with ${status}:\n${out}\n${err}")
endif()
file(READ "${OUT}/odd/results.json" json)
string(JSON data GET "${json}" data)
string(JSON attacked TYPE "${json}" routers ssr-l bpb_attacked 0)
string(JSON attacked_mean TYPE "${json}" paired softmax ssr-l bpb_attacked mean)
string(JSON clean_mean TYPE "${json}" paired softmax ssr-l bpb mean)
if(NOT data STREQUAL odd OR NOT attacked STREQUAL "NULL" OR NOT attacked_mean STREQUAL "NULL"
   OR NOT clean_mean STREQUAL "NUMBER")
  message(FATAL_ERROR "results.json with --attack 0: data '${data}', attacked ${attacked} and ${attacked_mean}, "
                      "clean ${clean_mean}")
endif()

# Options it cannot honour stop it with their name: numbers with trailing text, a negative seed, sequences
# longer than a batch, a text shorter than the context and one sequence, noise that is not a number, a
# router named twice.
file(WRITE "${OUT}/short.txt" "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings")
foreach(case IN ITEMS "--steps;1x;--steps takes a number, not '1x'" "--seed;-1;--seed takes a number, not '-1'"
                      "--capacity;1,5;--capacity takes a number" "--seq-len;64;--batch;32;--seq-len must not exceed --batch"
                      "--data;${OUT}/short.txt;--seq-len;256;bytes holds no 4 bytes of context and a sequence of 256"
                      "--noise;nan;--noise must be finite and >= 0" "--routers;ssr-l,softmax,ssr-l;--routers names ssr-l twice")
  list(POP_BACK case expected)
  execute_process(COMMAND "${DEMO}" --steps 1 --routers softmax ${case} --out "${OUT}/bad"
    RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${expected}" at)
  if(status EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "ssr-smoe-demo ${case}: exit ${status}, expected an error with '${expected}':\n${err}")
  endif()
endforeach()
message(STATUS "ssr-smoe-demo: table, paired differences, steps.csv, load.svg, loss.svg and results.json as expected")
