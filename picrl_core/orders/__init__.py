"""The order PIC-RL's controller acts on, one rule per file: the paper's Gaussian order (:mod:`~picrl_core.orders.
gaussian`), the repeat mixture (:mod:`~picrl_core.orders.repeat_mixture`) or the hurdle around either
(:mod:`~picrl_core.orders.hurdle`), each an :class:`~picrl_core.orders.order.OrderRule` chosen once when a controller
is built (:func:`~picrl_core.orders.choice.order_rule`)."""
