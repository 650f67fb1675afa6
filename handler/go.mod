module gpupack.io/handler

go 1.22
