"""What the data must satisfy before step 1: labels against the model and loss
(`label_contract.py`), finite values (`finite.py`), one sample weight per example (`weights.py`)."""
