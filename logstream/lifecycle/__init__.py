"""The model lifecycle: training, the model directory's schema, the model store and the
follower of its live version, candidates, shadows, retraining, and operators' feedback.
"""
