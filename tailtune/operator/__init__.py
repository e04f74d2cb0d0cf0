"""The tailtune operator: kopf handlers (thin) around one reconcile (observe → desire → apply → status)."""
