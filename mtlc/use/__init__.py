"""Using a trained model: the classifier, calibration, predictions and what to label next, the audit, reports and figures, the review page, Label Studio and ONNX."""
