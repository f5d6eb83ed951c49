"""The ground floor: helpers every layer may use; they import nothing above them."""
