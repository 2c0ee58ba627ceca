"""hami-vendor-awsneuron: AWS Trainium and Inferentia (Neuron devices and NeuronCores) for hami-core.

The hook implementations are in `hami_vendor_awsneuron.plugin`.
"""
