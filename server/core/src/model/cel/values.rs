//! Runtime values a selector reads: quantities, semantic versions, and a device with
//! its attribute and capacity domains, without copying the device. Part of
//! `model/cel.rs`.

use super::*;

/// A quantity value: exact signed nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantityVal(pub i128);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|o| o.0 == self.0)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for QuantityVal {}

/// A semantic version value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemverVal(pub Semver);

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }

    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|o| o.0.precedence(&self.0) == Ordering::Equal)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for SemverVal {}

/// `device`: driver, attributes and capacity of one device, read in place.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeviceVal<'a> {
    pub(super) driver: &'a str,
    pub(super) device: &'a Device,
}

/// Which of a device's maps a value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Attributes,
    Capacity,
}

/// `device.attributes` or `device.capacity`: domain → names.
#[derive(Debug, Clone, Copy)]
pub(super) struct DomainsVal<'a> {
    pub(super) device: DeviceVal<'a>,
    pub(super) part: Part,
}

/// `device.attributes["domain"]` or `device.capacity["domain"]`.
#[derive(Debug, Clone)]
pub(super) struct DomainVal<'a> {
    pub(super) device: DeviceVal<'a>,
    pub(super) part: Part,
    pub(super) domain: String,
}

pub(super) fn key_of(key: &dyn Val) -> Result<&str, ExecutionError> {
    key.downcast_ref::<CelString>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: key.get_type().name().to_owned(),
            want: "string".to_owned(),
        })
}

/// Splits a qualified attribute or capacity name into (domain, id); a name without a
/// domain belongs to the driver's domain.
pub fn split_qualified<'n>(driver: &'n str, name: &'n str) -> (&'n str, &'n str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

pub(super) fn attribute_val<'v>(value: &'v AttributeValue) -> Box<dyn Val + 'v> {
    let list =
        |items: Vec<Box<dyn Val + 'v>>| -> Box<dyn Val + 'v> { Box::new(CelList::from(items)) };
    match value {
        AttributeValue::Int(n) => Box::new(CelInt::from(*n)),
        AttributeValue::Bool(b) => Box::new(CelBool::from(*b)),
        AttributeValue::String(s) => Box::new(CelString::from(s.as_str())),
        AttributeValue::Version(v) => version_val(v),
        AttributeValue::Ints(l) => list(l.iter().map(|n| int_val(*n)).collect()),
        AttributeValue::Bools(l) => list(l.iter().map(|b| bool_val(*b)).collect()),
        AttributeValue::Strings(l) => list(l.iter().map(|s| string_val(s)).collect()),
        AttributeValue::Versions(l) => list(l.iter().map(|v| version_val(v)).collect()),
    }
}

pub(super) fn int_val<'v>(n: i64) -> Box<dyn Val + 'v> {
    Box::new(CelInt::from(n))
}

pub(super) fn bool_val<'v>(b: bool) -> Box<dyn Val + 'v> {
    Box::new(CelBool::from(b))
}

pub(super) fn string_val<'v>(s: &'v str) -> Box<dyn Val + 'v> {
    Box::new(CelString::from(s))
}

pub(super) fn version_val<'v>(v: &'v str) -> Box<dyn Val + 'v> {
    match Semver::parse(v) {
        Ok(version) => Box::new(SemverVal(version)),
        // Validated pools only hold valid versions; a string keeps a bad one visible.
        Err(_) => Box::new(CelString::from(v)),
    }
}

impl<'a> DomainVal<'a> {
    pub(super) fn lookup<'v>(&self, id: &str) -> Option<Box<dyn Val + 'v>>
    where
        'a: 'v,
    {
        let driver = self.device.driver;
        let device = self.device.device;
        match self.part {
            Part::Attributes => device
                .attributes
                .iter()
                .find(|(name, _)| split_qualified(driver, name) == (self.domain.as_str(), id))
                .map(|(_, value)| attribute_val(value)),
            Part::Capacity => device
                .capacity
                .iter()
                .find(|(name, _)| split_qualified(driver, name) == (self.domain.as_str(), id))
                .map(|(_, cap)| {
                    let nano = i128::try_from(cap.value.nano()).unwrap_or(i128::MAX);
                    Box::new(QuantityVal(nano)) as Box<dyn Val + 'v>
                }),
        }
    }

    pub(super) fn count(&self) -> usize {
        let driver = self.device.driver;
        let in_domain = |name: &str| split_qualified(driver, name).0 == self.domain;
        match self.part {
            Part::Attributes => self
                .device
                .device
                .attributes
                .keys()
                .filter(|n| in_domain(n.as_str()))
                .count(),
            Part::Capacity => self
                .device
                .device
                .capacity
                .keys()
                .filter(|n| in_domain(n.as_str()))
                .count(),
        }
    }
}

impl<'a> Val for DeviceVal<'a> {
    fn get_type(&self) -> &Type {
        &DEVICE_TYPE
    }

    fn cel_type() -> &'static Type {
        &DEVICE_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

impl<'a> Indexer for DeviceVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match key_of(idx)? {
            "driver" => Ok(CowVal::owned(CelString::from(self.driver))),
            "attributes" => Ok(CowVal::owned(DomainsVal {
                device: *self,
                part: Part::Attributes,
            })),
            "capacity" => Ok(CowVal::owned(DomainsVal {
                device: *self,
                part: Part::Capacity,
            })),
            "allowMultipleAllocations" => Ok(CowVal::owned(CelBool::from(
                self.device.sharing == AllocationSharing::Shared,
            ))),
            other => Err(ExecutionError::no_such_key(other)),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Val for DomainsVal<'a> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

impl<'a> Indexer for DomainsVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        // An unknown domain is an empty map, as Kubernetes' map with a default.
        Ok(CowVal::owned(DomainVal {
            device: self.device,
            part: self.part,
            domain: key_of(idx)?.to_string(),
        }))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Val for DomainVal<'a> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }

    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(self.clone())
    }
}

impl<'a> Indexer for DomainVal<'a> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let id = key_of(idx)?;
        self.lookup(id)
            .map(CowVal::Owned)
            .ok_or_else(|| ExecutionError::no_such_key(id))
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Container for DomainVal<'a> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(self.lookup(key_of(value)?).is_some())
    }
}

impl<'a> Sizer for DomainVal<'a> {
    fn size(&self) -> CelInt {
        CelInt::from(i64::try_from(self.count()).unwrap_or(i64::MAX))
    }
}
