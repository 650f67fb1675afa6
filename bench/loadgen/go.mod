module gpupack.invalid/loadgen

go 1.26.0
