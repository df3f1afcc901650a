"""The server twin and the SimPy driver."""
