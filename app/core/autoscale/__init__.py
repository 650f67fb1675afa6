"""Scale-up requests sized by gpupack's own packing (pure): what GPU capacity pending pods need."""
