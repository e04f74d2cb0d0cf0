"""The local demo: a process runtime for the local cluster, a real Prometheus, load, and `tailtune demo`.

Everything is real except the GPU: the runtime runs each Triton pod as a real `tritonserver` whose model is
the EMULATED accelerator (`tailtune/triton/models/emulated_gpu`), never a GPU. Development use only.
"""
