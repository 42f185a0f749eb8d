"""Looking inside a policy: Grad-CAM saliency, per-neuron traces, the HTML dashboard."""
