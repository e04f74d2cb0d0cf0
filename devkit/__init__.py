"""tailtune's development harness, beside the product: it may import `tailtune`, never the reverse.

The local cluster (`cluster`: a real control plane with kwok fake GPU nodes), the process runtime that plays
the kubelet of the demo's nodes (`runtime`, `pods`, `shim`, `emulation`), a real Prometheus (`prometheus`),
the load generator and report (`load`, `report`), `tailtune demo` (`demo`), and the Triton test harness
(`triton`: a local tritonserver, perf_analyzer, CPU test models). Everything is real except the GPU: the
runtime runs each Triton pod as a real `tritonserver` whose model is the EMULATED accelerator
(`devkit/triton/models/emulated_gpu`). Needs a tailtune checkout (`checkout`) and the `devkit` extra.
"""
