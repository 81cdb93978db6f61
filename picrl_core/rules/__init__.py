"""Decision rules, one file each.

The order PIC-RL's controller acts on (Eq. 11 and the mixtures around it) is one :class:`~picrl_core.rules.order.
OrderRule`, chosen once when the controller is built (:func:`~picrl_core.rules.choice.order_rule`): the paper's Gaussian
order (:mod:`~picrl_core.rules.gaussian`), the repeat mixture (:mod:`~picrl_core.rules.repeat_mixture`) or the hurdle
around either (:mod:`~picrl_core.rules.hurdle`). A whole method that a worker can deploy is one
:class:`~picrl_core.rules.base.DeployableRule` (:mod:`picrl_core.deployable` lists them).
"""
